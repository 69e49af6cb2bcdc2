package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/checkins/checkins/adapters/redistest"
)

// BenchmarkPostCheckin drives POST /checkins the way `checkins bench --phases ingest` does, in
// process: the service wired by NewService as `serve` wires it (API only, HS256 authentication,
// the default per-user rate limit, LOG_LEVEL info), on a real listener, against a private
// redis-server, from keep-alive clients each posting a distinct check-in of one of 10,000 users.
//
// ns/op is wall time per request over all clients; on shared cores cpu-µs/op (this process:
// client and service, as the bench counts it) and redis-cpu-µs/op swing much less.
//
//	go test ./cmd/checkins -run '^$' -bench PostCheckin -count 6 -cpuprofile cpu.out -memprofile mem.out
func BenchmarkPostCheckin(b *testing.B) {
	srv := redistest.Start(b, redistest.Options{})
	env := withTestAuth(map[string]string{"REDIS_URL": srv.URL(), "HTTP_ADDR": "127.0.0.1:0", "KEY_PREFIX": "bench", "LOG_LEVEL": "info"})
	delete(env, "RATE_LIMIT_USER") // unset: the default limit, as the bench runs it
	cfg, _, err := parseConfig(flag.NewFlagSet("bench", flag.ContinueOnError), nil, func(k string) string { return env[k] })
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	svc, err := NewService(ctx, cfg, Mode{API: true}, newLogger(io.Discard, cfg.LogLevel))
	if err != nil {
		cancel()
		b.Fatal(err)
	}
	addr, err := svc.Listen()
	if err != nil {
		cancel()
		b.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	b.Cleanup(func() { cancel(); <-done })
	url := "http://" + addr.String() + "/checkins"
	rdb := redistest.Client(b, srv.URL())

	const users = 10000
	tokens := make([]string, users+1)
	for u := int64(1); u <= users; u++ {
		tokens[u] = testToken(u)
	}
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{Proxy: nil, MaxIdleConns: 256,
		MaxIdleConnsPerHost: 256, IdleConnTimeout: 90 * time.Second, DisableCompression: true}}
	b.Cleanup(hc.CloseIdleConnections)
	var seq atomic.Int64
	post := func(buf []byte) error {
		n := seq.Add(1)
		user := 1 + n%users
		buf = append(buf[:0], `{"checkinId":"bench-`...)
		buf = strconv.AppendInt(buf, n, 10)
		buf = append(buf, `","userId":`...)
		buf = strconv.AppendInt(buf, user, 10)
		buf = append(buf, `,"locationId":`...)
		buf = strconv.AppendInt(buf, 1+n%1000, 10)
		buf = append(buf, `,"starRating":`...)
		buf = strconv.AppendInt(buf, n%6, 10)
		buf = append(buf, `,"timestamp":1609602085397}`...)
		req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(buf))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+tokens[user])
		resp, err := hc.Do(req)
		if err != nil {
			return err
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusAccepted {
			return fmt.Errorf("status %d: %s", resp.StatusCode, body)
		}
		return nil
	}
	if err := post(nil); err != nil { // scripts loaded, pools warm
		b.Fatal(err)
	}

	// 50 clients like the bench's ingest phase, whatever GOMAXPROCS is.
	b.SetParallelism((50 + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
	redisCPU0 := redisCPU(b, rdb.Info(context.Background(), "cpu").Val())
	st0 := rdb.Info(context.Background(), "stats").Val()
	cpu0 := processCPU(b)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		buf := make([]byte, 0, 256)
		for pb.Next() {
			if err := post(buf); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64((processCPU(b)-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
	b.ReportMetric((redisCPU(b, rdb.Info(context.Background(), "cpu").Val())-redisCPU0)*1e6/float64(b.N), "redis-cpu-µs/op")
	st1 := rdb.Info(context.Background(), "stats").Val()
	for _, f := range []string{"total_commands_processed", "total_reads_processed"} {
		b.ReportMetric((infoInt(st1, f)-infoInt(st0, f))/float64(b.N), f)
	}
}

// processCPU is the user+system CPU time this process has used so far.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// redisCPU is used_cpu_sys + used_cpu_user, in seconds, from INFO cpu.
func redisCPU(b testing.TB, info string) float64 {
	var sum float64
	for _, line := range strings.Split(info, "\r\n") {
		k, v, _ := strings.Cut(line, ":")
		if k == "used_cpu_sys" || k == "used_cpu_user" {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				b.Fatal(err)
			}
			sum += f
		}
	}
	return sum
}

func infoInt(info, field string) float64 {
	for _, line := range strings.Split(info, "\r\n") {
		if k, v, _ := strings.Cut(line, ":"); k == field {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	return 0
}
