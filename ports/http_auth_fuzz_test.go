package ports

import (
	"errors"
	"strings"
	"testing"
)

// FuzzParseBearer: whatever the Authorization header holds, the parser never panics, and a
// token it accepts is a non-empty token68 of at most MaxTokenBytes that parses back to itself;
// anything else is one of its three answers.
func FuzzParseBearer(f *testing.F) {
	for _, seed := range []string{
		"", "Bearer", "Bearer ", "Bearer abc", "bearer abc", "BEARER abc", "Bearer  abc", " Bearer abc ",
		"Bearer abc def", "Bearer abc,def", "Bearer a.b.c", "Bearer eyJhbGciOiJIUzI1NiJ9.e30.sig_-~+/==",
		"Bearer ===", "Bearer abc=", "Bearer ab=c", "Basic dXNlcjpwYXNz", "Bearerabc", "Bearer\tabc",
		"Bearer \x00", "Bearer é", "Token abc", "Bearer " + strings.Repeat("a", MaxTokenBytes+1),
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, h string) {
		tok, err := ParseBearer(h)
		switch {
		case err == nil:
			if tok == "" || len(tok) > MaxTokenBytes {
				t.Fatalf("accepted %q from %q", tok, h)
			}
			for i := 0; i < len(tok); i++ {
				c := tok[i]
				if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("-._~+/=", c) >= 0) {
					t.Fatalf("accepted byte %q in %q", c, tok)
				}
			}
			if again, err := ParseBearer("Bearer " + tok); err != nil || again != tok {
				t.Fatalf("%q does not parse back: %q, %v", tok, again, err)
			}
			if !strings.Contains(h, tok) {
				t.Fatalf("token %q is not from the header %q", tok, h)
			}
		case errors.Is(err, errNoBearer), errors.Is(err, ErrTokenMalformed), errors.Is(err, ErrTokenTooLarge):
			if tok != "" {
				t.Fatalf("returned %q with error %v", tok, err)
			}
		default:
			t.Fatalf("unexpected error %v for %q", err, h)
		}
	})
}
