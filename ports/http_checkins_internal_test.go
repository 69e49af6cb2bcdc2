package ports

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/labstack/echo/v4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/checkins/checkins/domain"
)

// The accepted answer appended by hand is what c.JSON writes: status, headers and body bytes.
func TestAcceptedJSONIsEchoJSON(t *testing.T) {
	t.Parallel()
	e := echo.New()
	for _, tc := range []struct {
		name  string
		query string
		ch    domain.Checkin
	}{
		{"plain", "", domain.Checkin{ID: "c-0001", UserID: 42, LocationID: 7, StarRating: 4, Timestamp: 1609602085397}},
		{"zeros", "", domain.Checkin{}},
		{"negative", "", domain.Checkin{ID: "x", UserID: -1, LocationID: -2, StarRating: -3, Timestamp: -4}},
		{"escapes", "", domain.Checkin{ID: "a\"b\\c\n<&>\u2028é\xff", UserID: 1}},
		{"html only", "", domain.Checkin{ID: "a<b", UserID: 1}},
		{"pretty", "pretty", domain.Checkin{ID: "c-2", UserID: 2, LocationID: 3, StarRating: 5, Timestamp: 6}},
		{"other query", "x=1", domain.Checkin{ID: "c-3", UserID: 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			answer := func(write func(echo.Context) error) *httptest.ResponseRecorder {
				rec := httptest.NewRecorder()
				req := httptest.NewRequest(http.MethodPost, "/checkins?"+tc.query, nil)
				require.NoError(t, write(e.NewContext(req, rec)))
				return rec
			}
			want := answer(func(c echo.Context) error { return c.JSON(http.StatusAccepted, toResponse(tc.ch)) })
			got := answer(func(c echo.Context) error { return acceptedJSON(c, tc.ch) })
			assert.Equal(t, want.Code, got.Code)
			assert.Equal(t, want.Header(), got.Header())
			assert.Equal(t, want.Body.String(), got.Body.String())
		})
	}
}
