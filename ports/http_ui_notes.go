package ports

import (
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/checkins/checkins/app/ops"
)

// A banner on the page an action redirects to is asked for by key (?msg=<key> for news,
// ?err=<key> for a failure) with the few values its text needs. The texts are the server's
// own, and each value is of a kind the server checks (a poison entry ID, a projection of this
// build, a number), so a link cannot put words of its own on the page ("Session expired. Paste
// your token at ..."): an unknown key, or one whose values are missing or not of their kind,
// shows nothing.

// uiNote is a banner's key and values; the zero values are "not given".
type uiNote struct {
	Key  string
	ID   string // a poison entry: id
	Name string // a projection: name
	// Counts (n, failed, skipped) and versions (from, to); 0 when not given.
	N, Failed, Skipped, From, To int64
	More                         bool // a bulk action stopped at its limit: more
	Outage                       bool // and it stopped because Redis did not answer
}

// text is the note's banner; ok is false for an unknown key, or when a value the text needs
// is missing.
func (n uiNote) text() (s string, ok bool) {
	switch n.Key {
	case "replayed":
		return fmt.Sprintf("replayed %s into %s, entry deleted", n.ID, n.Name), n.ID != "" && n.Name != ""
	case "replayed-already":
		return fmt.Sprintf("replayed %s into %s, which had already counted it (nothing changed); entry deleted", n.ID, n.Name), n.ID != "" && n.Name != ""
	case "replay-failed":
		return fmt.Sprintf("replay failed again: the entry stays in the queue as %s, with the new error", n.ID), n.ID != ""
	case "not-replayable":
		return fmt.Sprintf("%s cannot be replayed: it is no check-in this build can apply, or names a projection it does not have; it is kept unchanged", n.ID), n.ID != ""
	case "not-found":
		return fmt.Sprintf("poison entry %s is not there: replayed or purged meanwhile", n.ID), n.ID != ""
	case "bad-id":
		return "that is not a poison entry ID", true
	case "purged":
		return "purged " + n.ID, n.ID != ""
	case "unknown-projection":
		return "unknown projection: choose one from the list", true
	case "replayed-all":
		s = fmt.Sprintf("replayed %d, failed %d, not replayable %d", n.N, n.Failed, n.Skipped)
		switch {
		case n.Outage:
			s += "; stopped: Redis did not answer (the rest is untouched), replay all again once it does"
		case n.More:
			s += "; stopped when the request's time ran out, replay all again for the rest"
		}
		return s, true
	case "purged-all":
		s = fmt.Sprintf("purged %d entries", n.N)
		switch {
		case n.Outage:
			s += "; stopped: Redis did not answer (the rest is untouched), purge again once it does"
		case n.More:
			s += "; stopped when the request's time ran out, purge again for the rest"
		}
		return s, true
	case "bad-until":
		return "nothing done: the page's bound is not a poison entry ID; reload the page", true
	case "purge-unconfirmed":
		want := n.Name
		if want == "" {
			want = "all"
		}
		return fmt.Sprintf("nothing purged: type %q to confirm purging every entry", want), true
	case "rebuild-started":
		return fmt.Sprintf("rebuild of %s started: v%d to v%d; projectors build it while v%d serves", n.Name, n.From, n.To, n.From),
			n.Name != "" && n.From > 0 && n.To > 0
	case "rebuild-busy":
		return fmt.Sprintf("cannot start a rebuild of %s now: the previous rebuild is still removing the old version", n.Name), n.Name != ""
	case "rebuild-unknown":
		return "no projection of that name in this build", true
	}
	return "", false
}

// noteText is the banner of kind ("msg" or "err") the request asks for, "" for none.
func (u *UI) noteText(c echo.Context, kind string) string {
	valid := true
	count := func(k string) int64 {
		v := c.QueryParam(k)
		if v == "" {
			return 0
		}
		n, err := strconv.ParseInt(v, 10, 32)
		if err != nil || n < 0 {
			valid = false
		}
		return n
	}
	n := uiNote{Key: c.QueryParam(kind), N: count("n"), Failed: count("failed"), Skipped: count("skipped"), From: count("from"), To: count("to"),
		More: c.QueryParam("more") == "1", Outage: c.QueryParam("outage") == "1"}
	if id := c.QueryParam("id"); id != "" && ops.ValidateCursor("id", id) == nil {
		n.ID = id
	}
	if name := c.QueryParam("name"); slices.Contains(u.cfg.Names, name) {
		n.Name = name
	}
	s, ok := n.text()
	if !ok || !valid {
		return ""
	}
	return s
}

// back redirects to the page an action came from (to), with the banner n of kind "msg" or
// "err".
func back(c echo.Context, to, kind string, n uiNote) error {
	q := url.Values{kind: {n.Key}}
	if n.ID != "" {
		q.Set("id", n.ID)
	}
	if n.Name != "" {
		q.Set("name", n.Name)
	}
	for k, v := range map[string]int64{"n": n.N, "failed": n.Failed, "skipped": n.Skipped, "from": n.From, "to": n.To} {
		if v != 0 {
			q.Set(k, strconv.FormatInt(v, 10))
		}
	}
	if n.More {
		q.Set("more", "1")
	}
	if n.Outage {
		q.Set("outage", "1")
	}
	sep := "?"
	if strings.Contains(to, "?") {
		sep = "&"
	}
	return c.Redirect(http.StatusSeeOther, to+sep+q.Encode())
}
