package main

import (
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The README is part of the product: these checks keep it true as settings and commands change.
func TestReadmeListsEverySettingWithItsDefault(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	for _, s := range settings() {
		def := ""
		if s.def != "" {
			def = "`" + s.def + "`"
		}
		row := fmt.Sprintf("| `%s` | `--%s` | %s |", s.env, s.flag, def)
		assert.Contains(t, string(readme), row, "README configuration table row for %s", s.env)
	}
}

func TestReadmeCommandsExist(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	cmds := commands()
	for _, m := range regexp.MustCompile("`checkins ([a-z]+)").FindAllStringSubmatch(string(readme), -1) {
		_, ok := cmds[m[1]]
		assert.True(t, ok, "README mentions `checkins %s`, which is not a command", m[1])
	}
	ci, err := os.ReadFile("../../.ci/run")
	require.NoError(t, err)
	assert.Contains(t, string(readme), "go tool task test", "README's test command")
	assert.Contains(t, string(ci), "go tool task test", ".ci/run runs the README's test command")
	assert.True(t, strings.Contains(string(readme), "go run ./cmd/checkins"), "README's run command")
}
