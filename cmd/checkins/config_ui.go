package main

import "time"

// uiConfig is the dashboard's event streams (/ui/events on the ops listener).
type uiConfig struct {
	Heartbeat  time.Duration
	MaxStreams int
}

type intSetter func(dst func(*Config) *int, min int) func(*Config, string) error

func uiSettings(dur durSetter, integer intSetter) []setting {
	return []setting{
		{"UI_HEARTBEAT", "ui-heartbeat", "15s", "the dashboard's event stream sends a heartbeat comment this often, so proxies keep it open", dur(func(c *Config) *time.Duration { return &c.UI.Heartbeat }, 100*time.Millisecond)},
		{"UI_MAX_STREAMS", "ui-max-streams", "32", "most dashboard event streams open at once per process (503 beyond it); each holds an ops connection, so at most 48 (the ops listener keeps 16 of its 64 for the rest)", integer(func(c *Config) *int { return &c.UI.MaxStreams }, 1)},
	}
}
