package domain_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/domain"
)

var testNow = time.Date(2026, 3, 14, 15, 9, 26, 0, time.UTC)

func p[T any](v T) *T { return &v }

// validInput is a complete, valid input; cases change one thing in it.
func validInput() domain.CheckinInput {
	return domain.CheckinInput{
		CheckinID:  p("ck-1"),
		UserID:     p(int64(42)),
		LocationID: p(int64(7)),
		StarRating: p(int64(4)),
		Timestamp:  p(testNow.Add(-time.Hour).UnixMilli()),
	}
}

func fixedID() string { return "generated-id" }

func TestNewCheckinValidation(t *testing.T) {
	t.Parallel()
	nowMs := testNow.UnixMilli()
	tests := []struct {
		name      string
		change    func(*domain.CheckinInput)
		wantField string // "" means valid
		wantCode  string
	}{
		{name: "valid", change: func(*domain.CheckinInput) {}},
		{name: "userId missing", change: func(in *domain.CheckinInput) { in.UserID = nil }, wantField: "userId", wantCode: domain.CodeRequired},
		{name: "userId zero", change: func(in *domain.CheckinInput) { in.UserID = p(int64(0)) }, wantField: "userId", wantCode: domain.CodeOutOfRange},
		{name: "userId negative", change: func(in *domain.CheckinInput) { in.UserID = p(int64(-1)) }, wantField: "userId", wantCode: domain.CodeOutOfRange},
		{name: "userId one", change: func(in *domain.CheckinInput) { in.UserID = p(int64(1)) }},
		{name: "locationId missing", change: func(in *domain.CheckinInput) { in.LocationID = nil }, wantField: "locationId", wantCode: domain.CodeRequired},
		{name: "locationId zero", change: func(in *domain.CheckinInput) { in.LocationID = p(int64(0)) }, wantField: "locationId", wantCode: domain.CodeOutOfRange},
		{name: "locationId negative", change: func(in *domain.CheckinInput) { in.LocationID = p(int64(-9)) }, wantField: "locationId", wantCode: domain.CodeOutOfRange},
		{name: "locationId one", change: func(in *domain.CheckinInput) { in.LocationID = p(int64(1)) }},
		{name: "starRating missing", change: func(in *domain.CheckinInput) { in.StarRating = nil }, wantField: "starRating", wantCode: domain.CodeRequired},
		{name: "starRating below 0", change: func(in *domain.CheckinInput) { in.StarRating = p(int64(-1)) }, wantField: "starRating", wantCode: domain.CodeOutOfRange},
		{name: "starRating above 5", change: func(in *domain.CheckinInput) { in.StarRating = p(int64(6)) }, wantField: "starRating", wantCode: domain.CodeOutOfRange},
		{name: "starRating huge", change: func(in *domain.CheckinInput) { in.StarRating = p(int64(1 << 40)) }, wantField: "starRating", wantCode: domain.CodeOutOfRange},
		{name: "starRating 0", change: func(in *domain.CheckinInput) { in.StarRating = p(int64(0)) }},
		{name: "starRating 5", change: func(in *domain.CheckinInput) { in.StarRating = p(int64(5)) }},
		{name: "timestamp absent", change: func(in *domain.CheckinInput) { in.Timestamp = nil }},
		{name: "timestamp zero", change: func(in *domain.CheckinInput) { in.Timestamp = p(int64(0)) }, wantField: "timestamp", wantCode: domain.CodeOutOfRange},
		{name: "timestamp negative", change: func(in *domain.CheckinInput) { in.Timestamp = p(int64(-1)) }, wantField: "timestamp", wantCode: domain.CodeOutOfRange},
		{name: "timestamp one", change: func(in *domain.CheckinInput) { in.Timestamp = p(int64(1)) }},
		{name: "timestamp years ago", change: func(in *domain.CheckinInput) { in.Timestamp = p(testNow.AddDate(-7, 0, 0).UnixMilli()) }},
		{name: "timestamp exactly 5 min ahead", change: func(in *domain.CheckinInput) { in.Timestamp = p(nowMs + domain.MaxFutureSkew.Milliseconds()) }},
		{name: "timestamp 5 min 1 ms ahead", change: func(in *domain.CheckinInput) { in.Timestamp = p(nowMs + domain.MaxFutureSkew.Milliseconds() + 1) }, wantField: "timestamp", wantCode: domain.CodeOutOfRange},
		{name: "timestamp a year ahead", change: func(in *domain.CheckinInput) { in.Timestamp = p(testNow.AddDate(1, 0, 0).UnixMilli()) }, wantField: "timestamp", wantCode: domain.CodeOutOfRange},
		{name: "checkinId absent", change: func(in *domain.CheckinInput) { in.CheckinID = nil }},
		{name: "checkinId empty", change: func(in *domain.CheckinInput) { in.CheckinID = p("") }, wantField: "checkinId", wantCode: domain.CodeRequired},
		{name: "checkinId all allowed characters", change: func(in *domain.CheckinInput) { in.CheckinID = p("azAZ09.-_:") }},
		{name: "checkinId 128 chars", change: func(in *domain.CheckinInput) { in.CheckinID = p(strings.Repeat("x", 128)) }},
		{name: "checkinId 129 chars", change: func(in *domain.CheckinInput) { in.CheckinID = p(strings.Repeat("x", 129)) }, wantField: "checkinId", wantCode: domain.CodeOutOfRange},
		{name: "checkinId with space", change: func(in *domain.CheckinInput) { in.CheckinID = p("a b") }, wantField: "checkinId", wantCode: domain.CodeInvalid},
		{name: "checkinId with slash", change: func(in *domain.CheckinInput) { in.CheckinID = p("a/b") }, wantField: "checkinId", wantCode: domain.CodeInvalid},
		{name: "checkinId with braces", change: func(in *domain.CheckinInput) { in.CheckinID = p("{user:1}") }, wantField: "checkinId", wantCode: domain.CodeInvalid},
		{name: "checkinId non-ASCII", change: func(in *domain.CheckinInput) { in.CheckinID = p("café") }, wantField: "checkinId", wantCode: domain.CodeInvalid},
		{name: "checkinId with newline", change: func(in *domain.CheckinInput) { in.CheckinID = p("a\nb") }, wantField: "checkinId", wantCode: domain.CodeInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			in := validInput()
			tt.change(&in)
			c, err := domain.NewCheckin(in, testNow, fixedID)
			if tt.wantField == "" {
				require.NoError(t, err)
				assert.Equal(t, *in.UserID, c.UserID)
				assert.Equal(t, *in.LocationID, c.LocationID)
				assert.Equal(t, int(*in.StarRating), c.StarRating)
				return
			}
			require.Error(t, err)
			var ve *domain.ValidationError
			require.ErrorAs(t, err, &ve)
			assert.Equal(t, tt.wantField, ve.Field)
			assert.Equal(t, tt.wantCode, ve.Code)
			assert.NotEmpty(t, ve.Message)
			assert.Contains(t, err.Error(), tt.wantField, "the error text names the field")
			assert.Equal(t, domain.Checkin{}, c, "nothing is returned on error")
		})
	}
}

func TestNewCheckinDefaults(t *testing.T) {
	t.Parallel()

	t.Run("absent timestamp defaults to now", func(t *testing.T) {
		t.Parallel()
		in := validInput()
		in.Timestamp = nil
		c, err := domain.NewCheckin(in, testNow, fixedID)
		require.NoError(t, err)
		assert.Equal(t, testNow.UnixMilli(), c.Timestamp)
	})

	t.Run("client timestamp is kept", func(t *testing.T) {
		t.Parallel()
		in := validInput()
		c, err := domain.NewCheckin(in, testNow, fixedID)
		require.NoError(t, err)
		assert.Equal(t, *in.Timestamp, c.Timestamp)
	})

	t.Run("absent checkinId is generated", func(t *testing.T) {
		t.Parallel()
		in := validInput()
		in.CheckinID = nil
		calls := 0
		c, err := domain.NewCheckin(in, testNow, func() string { calls++; return "gen-1" })
		require.NoError(t, err)
		assert.Equal(t, "gen-1", c.ID)
		assert.Equal(t, 1, calls)
	})

	t.Run("client checkinId is kept and no ID is generated", func(t *testing.T) {
		t.Parallel()
		in := validInput()
		c, err := domain.NewCheckin(in, testNow, func() string { t.Fatal("newID must not be called"); return "" })
		require.NoError(t, err)
		assert.Equal(t, "ck-1", c.ID)
	})
}

func TestFingerprint(t *testing.T) {
	t.Parallel()
	base := validInput()
	fp := base.Fingerprint()
	assert.Equal(t, fp, validInput().Fingerprint(), "same input, same fingerprint")

	noTS := validInput()
	noTS.Timestamp = nil
	assert.Equal(t, noTS.Fingerprint(), noTS.Fingerprint())
	// An absent timestamp must not be replaced by the time of the call: a retry a second later
	// is the same request, but a request that sent "now" explicitly is not.
	for _, ts := range []int64{0, 1, testNow.UnixMilli()} {
		withTS := validInput()
		withTS.Timestamp = p(ts)
		assert.NotEqual(t, noTS.Fingerprint(), withTS.Fingerprint(), "absent timestamp vs %d", ts)
	}

	changes := map[string]func(*domain.CheckinInput){
		"userId":             func(in *domain.CheckinInput) { in.UserID = p(*in.UserID + 1) },
		"locationId":         func(in *domain.CheckinInput) { in.LocationID = p(*in.LocationID + 1) },
		"starRating":         func(in *domain.CheckinInput) { in.StarRating = p(*in.StarRating - 1) },
		"timestamp":          func(in *domain.CheckinInput) { in.Timestamp = p(*in.Timestamp + 1) },
		"userId absent":      func(in *domain.CheckinInput) { in.UserID = nil },
		"fields swapped":     func(in *domain.CheckinInput) { in.UserID, in.LocationID = in.LocationID, in.UserID },
		"starRating absent":  func(in *domain.CheckinInput) { in.StarRating = nil },
		"locationId negated": func(in *domain.CheckinInput) { in.LocationID = p(-*in.LocationID) },
	}
	for name, change := range changes {
		in := validInput()
		change(&in)
		assert.NotEqual(t, fp, in.Fingerprint(), "a different body (%s) must differ", name)
	}
}

func TestValidationErrorText(t *testing.T) {
	t.Parallel()
	err := domain.ValidateCheckinID("bad id")
	var ve *domain.ValidationError
	require.True(t, errors.As(err, &ve))
	assert.True(t, strings.HasPrefix(err.Error(), "checkinId: "), err.Error())
}
