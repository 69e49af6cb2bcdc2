// Command vulngate is the offline vulnerability gate's helper (.ci/vulncheck.sh runs it):
//
//	vulngate db -src DIR -out DIR [-modified RFC3339]
//	    turns the OSV entries of the golang.org/x/vulndb module (data/osv/*.json) into the
//	    database layout govulncheck reads with -db file://DIR: index/db.json,
//	    index/modules.json, index/vulns.json and ID/<id>.json;
//	vulngate check -allow FILE [-in FILE]
//	    reads `govulncheck -format json` output and fails when a finding whose vulnerable
//	    symbol the code calls is not in the allow file.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"golang.org/x/mod/semver"
)

func main() {
	if err := run(os.Args[1:], os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "vulngate:", err)
		os.Exit(1)
	}
}

func run(args []string, stdin io.Reader, stdout io.Writer) error {
	if len(args) == 0 {
		return errors.New("usage: vulngate db -src DIR -out DIR | vulngate check -allow FILE [-in FILE]")
	}
	switch args[0] {
	case "db":
		fs := flag.NewFlagSet("vulngate db", flag.ContinueOnError)
		src := fs.String("src", "", "directory of OSV entries (the vulndb module's data/osv)")
		out := fs.String("out", "", "directory to write the database to (created; must not exist or be empty)")
		modified := fs.String("modified", "", "RFC 3339 time for entries whose modified time is unset (the snapshot's time)")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		if *src == "" || *out == "" {
			return errors.New("db needs -src and -out")
		}
		var mod time.Time
		if *modified != "" {
			t, err := time.Parse(time.RFC3339, *modified)
			if err != nil {
				return fmt.Errorf("-modified: %w", err)
			}
			mod = t
		}
		n, err := buildDB(*src, *out, mod)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "vulngate: database of %d entries in %s\n", n, *out)
		return nil
	case "check":
		fs := flag.NewFlagSet("vulngate check", flag.ContinueOnError)
		allowFile := fs.String("allow", "", "allowed findings: one ID and its reason per line")
		in := fs.String("in", "", "govulncheck -format json output (default: stdin)")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		if *allowFile == "" {
			return errors.New("check needs -allow")
		}
		allow, err := readAllow(*allowFile)
		if err != nil {
			return err
		}
		r := stdin
		if *in != "" {
			f, err := os.Open(*in)
			if err != nil {
				return err
			}
			defer f.Close()
			r = f
		}
		return check(r, allow, stdout)
	}
	return fmt.Errorf("unknown command %q (db or check)", args[0])
}

// entry is the part of an OSV entry the index needs; the file itself is copied as it is.
type entry struct {
	ID       string    `json:"id"`
	Modified time.Time `json:"modified"`
	Aliases  []string  `json:"aliases,omitempty"`
	Affected []struct {
		Module struct {
			Path string `json:"name"`
		} `json:"package"`
		Ranges []struct {
			Type   string `json:"type"`
			Events []struct {
				Introduced string `json:"introduced,omitempty"`
				Fixed      string `json:"fixed,omitempty"`
			} `json:"events"`
		} `json:"ranges,omitempty"`
	} `json:"affected"`
}

type dbMeta struct {
	Modified time.Time `json:"modified"`
}

type moduleVuln struct {
	ID       string    `json:"id"`
	Modified time.Time `json:"modified"`
	Fixed    string    `json:"fixed,omitempty"`
}

type moduleMeta struct {
	Path  string       `json:"path"`
	Vulns []moduleVuln `json:"vulns"`
}

type vulnMeta struct {
	ID       string    `json:"id"`
	Modified time.Time `json:"modified"`
	Aliases  []string  `json:"aliases,omitempty"`
}

var idPattern = regexp.MustCompile(`^GO-\d{4}-\d{4,}$`)

// buildDB writes the v1 database layout of the Go vulnerability database (as served at
// vuln.go.dev, without the .gz copies) from a directory of OSV files.
func buildDB(src, out string, modified time.Time) (int, error) {
	files, err := filepath.Glob(filepath.Join(src, "*.json"))
	if err != nil {
		return 0, err
	}
	if len(files) == 0 {
		return 0, fmt.Errorf("no OSV entries (*.json) in %s", src)
	}
	if err := os.MkdirAll(filepath.Join(out, "ID"), 0o750); err != nil {
		return 0, err
	}
	if err := os.MkdirAll(filepath.Join(out, "index"), 0o750); err != nil {
		return 0, err
	}
	meta := dbMeta{}
	modules := map[string]*moduleMeta{}
	var vulns []vulnMeta
	for _, f := range files {
		raw, err := os.ReadFile(f) // #nosec G304 -- files of the directory given on the command line
		if err != nil {
			return 0, err
		}
		var e entry
		if err := json.Unmarshal(raw, &e); err != nil {
			return 0, fmt.Errorf("%s: %w", f, err)
		}
		if !idPattern.MatchString(e.ID) || filepath.Base(f) != e.ID+".json" {
			return 0, fmt.Errorf("%s: an entry must be named <ID>.json with an ID like GO-2026-0001, got ID %q", f, e.ID)
		}
		if e.Modified.IsZero() && !modified.IsZero() {
			// The repository's files leave modified unset (the deployed database fills it in
			// from history): the snapshot's time is an upper bound.
			e.Modified = modified
			if raw, err = setModified(raw, modified); err != nil {
				return 0, fmt.Errorf("%s: %w", f, err)
			}
		}
		// #nosec G703 -- e.ID matched idPattern (GO-YYYY-NNNN) above: no separator, no ..
		if err := os.WriteFile(filepath.Join(out, "ID", e.ID+".json"), raw, 0o600); err != nil {
			return 0, err
		}
		if e.Modified.After(meta.Modified) {
			meta.Modified = e.Modified
		}
		vulns = append(vulns, vulnMeta{ID: e.ID, Modified: e.Modified, Aliases: e.Aliases})
		for _, a := range e.Affected {
			m := modules[a.Module.Path]
			if m == nil {
				m = &moduleMeta{Path: a.Module.Path, Vulns: []moduleVuln{}}
				modules[a.Module.Path] = m
			}
			m.Vulns = append(m.Vulns, moduleVuln{ID: e.ID, Modified: e.Modified, Fixed: latestFix(a.Ranges)})
		}
	}
	mods := make([]*moduleMeta, 0, len(modules))
	for _, m := range modules {
		sort.Slice(m.Vulns, func(i, j int) bool { return m.Vulns[i].ID < m.Vulns[j].ID })
		mods = append(mods, m)
	}
	sort.Slice(mods, func(i, j int) bool { return mods[i].Path < mods[j].Path })
	sort.Slice(vulns, func(i, j int) bool { return vulns[i].ID < vulns[j].ID })
	for name, v := range map[string]any{"db.json": meta, "modules.json": mods, "vulns.json": vulns} {
		b, err := json.Marshal(v)
		if err != nil {
			return 0, err
		}
		if err := os.WriteFile(filepath.Join(out, "index", name), b, 0o600); err != nil {
			return 0, err
		}
	}
	return len(files), nil
}

// setModified sets the entry's modified time, keeping every other field as it is.
func setModified(raw []byte, t time.Time) ([]byte, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, err
	}
	b, err := json.Marshal(t.UTC().Format(time.RFC3339))
	if err != nil {
		return nil, err
	}
	m["modified"] = b
	return json.Marshal(m)
}

// latestFix is the index's "fixed" of one affected module, as the database computes it: the
// greatest fixed version of its SEMVER ranges, none when the vulnerability was introduced
// again after it. A module at or above it is not affected, so govulncheck skips the entry.
func latestFix(ranges []struct {
	Type   string `json:"type"`
	Events []struct {
		Introduced string `json:"introduced,omitempty"`
		Fixed      string `json:"fixed,omitempty"`
	} `json:"events"`
}) string {
	less := func(a, b string) bool { return semver.Compare(canon(a), canon(b)) < 0 }
	latest := ""
	for _, r := range ranges {
		if r.Type != "SEMVER" {
			continue
		}
		for _, e := range r.Events {
			if e.Fixed != "" && less(latest, e.Fixed) {
				latest = e.Fixed
			}
		}
		for _, e := range r.Events {
			if e.Introduced != "" && e.Introduced != "0" && less(latest, e.Introduced) {
				return ""
			}
		}
	}
	return latest
}

func canon(v string) string {
	if v == "" {
		return ""
	}
	return "v" + strings.TrimPrefix(v, "v")
}

// readAllow reads lines of "ID reason...": blank lines and # comments are skipped; every ID needs
// a reason.
func readAllow(path string) (map[string]string, error) {
	f, err := os.Open(path) // #nosec G304 -- the allow file given on the command line
	if err != nil {
		return nil, err
	}
	defer f.Close()
	allow := map[string]string{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		id, reason, _ := strings.Cut(line, " ")
		reason = strings.TrimSpace(reason)
		if !idPattern.MatchString(id) {
			return nil, fmt.Errorf("%s:%d: %q is not a vulnerability ID like GO-2026-0001", path, n, id)
		}
		if reason == "" {
			return nil, fmt.Errorf("%s:%d: %s has no reason: say why it is allowed", path, n, id)
		}
		if _, dup := allow[id]; dup {
			return nil, fmt.Errorf("%s:%d: %s is listed twice", path, n, id)
		}
		allow[id] = reason
	}
	return allow, sc.Err()
}

// message is one object of govulncheck's JSON stream (the parts used here).
type message struct {
	Config *struct {
		DB             string `json:"db"`
		DBLastModified string `json:"db_last_modified"`
		GoVersion      string `json:"go_version"`
	} `json:"config"`
	OSV *struct {
		ID      string `json:"id"`
		Summary string `json:"summary"`
	} `json:"osv"`
	Finding *struct {
		OSV          string `json:"osv"`
		FixedVersion string `json:"fixed_version"`
		Trace        []struct {
			Module   string `json:"module"`
			Version  string `json:"version"`
			Package  string `json:"package"`
			Function string `json:"function"`
			Receiver string `json:"receiver"`
			Position *struct {
				Filename string `json:"filename"`
				Line     int    `json:"line"`
			} `json:"position"`
		} `json:"trace"`
	} `json:"finding"`
}

type finding struct {
	id, module, version, fixed, summary string
	calls                               []string // the trace, vulnerable symbol first
}

// check fails when the code calls a vulnerable symbol of a finding the allow file does not list.
// Findings whose module or package is only imported are reported, not failed: govulncheck found
// no call path to the vulnerable code.
func check(r io.Reader, allow map[string]string, w io.Writer) error {
	dec := json.NewDecoder(r)
	summaries := map[string]string{}
	called := map[string]*finding{}
	imported := map[string]bool{}
	sawConfig := false
	for {
		var m message
		if err := dec.Decode(&m); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return fmt.Errorf("reading govulncheck output: %w", err)
		}
		switch {
		case m.Config != nil:
			sawConfig = true
			fmt.Fprintf(w, "vulngate: govulncheck on %s, database %s (modified %s)\n", m.Config.GoVersion, m.Config.DB, m.Config.DBLastModified)
		case m.OSV != nil:
			summaries[m.OSV.ID] = m.OSV.Summary
		case m.Finding != nil && len(m.Finding.Trace) > 0:
			f := m.Finding
			if f.Trace[0].Function == "" {
				imported[f.OSV] = true
				continue
			}
			fd := called[f.OSV]
			if fd == nil {
				fd = &finding{id: f.OSV, module: f.Trace[0].Module, version: f.Trace[0].Version, fixed: f.FixedVersion}
				called[f.OSV] = fd
			}
			var path []string
			for _, fr := range f.Trace {
				name := fr.Package + "." + fr.Function
				if fr.Receiver != "" {
					name = fr.Package + "." + fr.Receiver + "." + fr.Function
				}
				if fr.Position != nil {
					name += fmt.Sprintf(" (%s:%d)", filepath.Base(fr.Position.Filename), fr.Position.Line)
				}
				path = append(path, name)
			}
			if len(fd.calls) == 0 {
				fd.calls = path
			}
		}
	}
	if !sawConfig {
		return errors.New("no govulncheck output (no config message): did govulncheck run?")
	}
	ids := make([]string, 0, len(called))
	for id := range called {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	var failed []string
	for _, id := range ids {
		f := called[id]
		f.summary = summaries[id]
		fixed := f.fixed
		if fixed == "" {
			fixed = "no fix"
		}
		status := "NEW"
		if reason, ok := allow[id]; ok {
			status = "allowed: " + reason
		} else {
			failed = append(failed, id)
		}
		fmt.Fprintf(w, "\n%s %s@%s (fixed in %s): %s\n  %s\n", id, f.module, f.version, fixed, f.summary, status)
		for i := len(f.calls) - 1; i >= 0; i-- {
			fmt.Fprintf(w, "    %s\n", f.calls[i])
		}
	}
	var stale []string
	for id := range allow {
		if called[id] == nil {
			stale = append(stale, id)
		}
	}
	sort.Strings(stale)
	var importedOnly []string
	for id := range imported {
		if called[id] == nil {
			importedOnly = append(importedOnly, id)
		}
	}
	sort.Strings(importedOnly)
	if len(importedOnly) > 0 {
		fmt.Fprintf(w, "\nvulngate: %d more advisories affect imported modules or packages without a call to the vulnerable code (not failed): %s\n",
			len(importedOnly), strings.Join(importedOnly, " "))
	}
	if len(stale) > 0 {
		fmt.Fprintf(w, "vulngate: allowed but no longer found, remove them from the allow file: %s\n", strings.Join(stale, " "))
	}
	if len(failed) > 0 {
		return fmt.Errorf("%d reachable vulnerabilities not in the allow file: %s (fix them, e.g. by upgrading the module, or list each with the reason it cannot affect us)",
			len(failed), strings.Join(failed, " "))
	}
	fmt.Fprintf(w, "vulngate: %d reachable vulnerabilities, all allowed with a reason\n", len(called))
	return nil
}
