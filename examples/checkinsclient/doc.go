// Package checkinsclient is a Go client of the checkins API generated from ports/openapi.yml,
// exactly as the README tells a client's author to generate one; cmd/checkins tests drive the
// real service with it. Never edit client.gen.go: run go generate.
package checkinsclient

//go:generate go tool oapi-codegen -generate types,client -package checkinsclient -o client.gen.go ../../ports/openapi.yml
