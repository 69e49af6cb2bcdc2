package adapters

import (
	"context"
	"slices"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Stream entries are written with their fields in one order, sorted by name. Redis keeps a
// stream in listpacks whose first entry's field names serve the entries after it: an entry with
// the same fields in the same order stores only its values. Watermill's publisher hands go-redis
// a map, whose order changes from one XADD to the next, so every entry carried its ten field
// names again: about 130 of its bytes (the bench's memory phase: 328 -> 192 B per entry in the
// stream; see the README's Redis memory).

// SortedXAddValues is values as XAddArgs.Values with the fields in the stream's order (sorted by
// name), for writers that XADD a marshalled entry themselves.
func SortedXAddValues(values map[string]any) []any {
	out := make([]any, 0, 2*len(values))
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range values {
			if !yield(k) {
				return
			}
		}
	}) {
		out = append(out, k, values[k])
	}
	return out
}

// sortXAddFields puts the field/value pairs of an XADD command's arguments (as go-redis's XAdd
// builds them) in the stream's order, in place. An argument list it does not recognise is left
// as it is: the order saves memory, it is never needed to read an entry.
func sortXAddFields(args []any) {
	// xadd stream [nomkstream] [maxlen|minid [~|=] n] [limit n] id field value ...
	i := 2
	word := func(j int) string {
		if j >= len(args) {
			return ""
		}
		s, _ := args[j].(string)
		return strings.ToLower(s)
	}
	if word(i) == "nomkstream" {
		i++
	}
	if w := word(i); w == "maxlen" || w == "minid" {
		i++
		if w := word(i); w == "~" || w == "=" {
			i++
		}
		i++
	}
	if word(i) == "limit" {
		i += 2
	}
	i++ // the ID
	pairs := args[min(i, len(args)):]
	if len(pairs) < 4 || len(pairs)%2 != 0 {
		return
	}
	for j := 0; j < len(pairs); j += 2 {
		if _, ok := pairs[j].(string); !ok {
			return
		}
	}
	sortPairs(pairs)
}

// sortPairs sorts field/value pairs (string fields) by field, in place: an insertion sort, as an
// entry has about ten fields, and it allocates nothing.
func sortPairs(pairs []any) {
	for j := 2; j < len(pairs); j += 2 {
		for k := j; k > 0 && pairs[k].(string) < pairs[k-2].(string); k -= 2 {
			pairs[k], pairs[k-2] = pairs[k-2], pairs[k]
			pairs[k+1], pairs[k-1] = pairs[k-1], pairs[k+1]
		}
	}
}

// fieldOrderHook writes every XADD of the client it is added to with its fields in the stream's
// order. Add it before hooks that send commands on their own (AutoPipeline.Hook): the first hook
// added runs first.
type fieldOrderHook struct{}

func (fieldOrderHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (fieldOrderHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if isXAdd(cmd) {
			sortXAddFields(cmd.Args())
		}
		return next(ctx, cmd)
	}
}

func (fieldOrderHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			if isXAdd(c) {
				sortXAddFields(c.Args())
			}
		}
		return next(ctx, cmds)
	}
}
