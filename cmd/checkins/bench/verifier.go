package bench

import (
	"context"
	"io"
	"log/slog"

	"github.com/checkins/checkins/adapters"
	"github.com/checkins/checkins/domain"
)

// Verifier is the bench's exactness check for other tests: every read model of every shipped
// projection, read through the projections' own queries, against an independent computation
// from the check-ins that were accepted.
type Verifier struct{ b *bencher }

// NewVerifier checks read models on cfg's Redis; Close releases it.
func NewVerifier(ctx context.Context, h Host, cfg Config) (*Verifier, error) {
	opts := benchOptions{Projections: ProjectionNames(h.Projections(cfg)), AllProjections: true}
	b, err := newBencher(ctx, h, cfg, opts, h.NewLogger(io.Discard, slog.LevelWarn), io.Discard)
	if err != nil {
		return nil, err
	}
	return &Verifier{b: b}, nil
}

// Verify says whether the read models under keys are exactly what checkins imply (each counted
// once), and, when not, how they differ.
func (v *Verifier) Verify(ctx context.Context, keys adapters.KeySpace, checkins []domain.Checkin) (bool, string, error) {
	want := newExpectedModel()
	for _, c := range checkins {
		want.add(c)
	}
	return v.b.verifyReadModels(ctx, keys, want)
}

// Close releases the verifier's connections (and a private Redis it would have started).
func (v *Verifier) Close() { v.b.close() }
