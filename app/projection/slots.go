package projection

import (
	"strings"
	"sync"
)

// SlotCount is the number of Redis Cluster hash slots.
const SlotCount = 16384

// KeySlot is the Redis Cluster hash slot of key: CRC16 (XMODEM) of its hash tag (the part
// between the first "{" and the next "}", when not empty) or of the whole key, mod 16384.
// Projections need it to spread a global read model over evenly spaced slots (SpreadTags);
// the adapters, to group a script's keys by slot.
func KeySlot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	return int(crc16(key) % SlotCount)
}

// crc16 is CRC-16/XMODEM (polynomial 0x1021, initial value 0), the checksum Redis Cluster uses.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

// SpreadTarget is the slot the i-th of n spread tags aims at: the middle of the i-th n-th of the
// slots, floor((2i+1) * 16384 / (2n)).
func SpreadTarget(i, n int) int { return (2*i + 1) * SlotCount / (2 * n) }

// SpreadTags are n hash tags on evenly spaced slots: the i-th takes the tag of the slot nearest
// to SpreadTarget(i, n) (the lower one on a tie) among the tags not taken by one before it. A
// slot's tag is its first string in shortlex order over [0-9a-z], one to three characters (they
// reach 16299 of the 16384 slots, always within a few slots of a target). A cluster whose M
// masters split the slots evenly (as redis-cli --cluster create and rebalance do) then holds
// n/M tags on every master when M divides n, and n/M rounded up or down otherwise.
func SpreadTags(n int) []string {
	tagOf := slotTags()
	used := map[string]bool{}
	out := make([]string, n)
	for i := range n {
		t := SpreadTarget(i, n)
		for d := 0; ; d++ {
			if s := t - d; s >= 0 && tagOf[s] != "" && !used[tagOf[s]] {
				out[i] = tagOf[s]
				break
			}
			if s := t + d; d > 0 && s < SlotCount && tagOf[s] != "" && !used[tagOf[s]] {
				out[i] = tagOf[s]
				break
			}
		}
		used[out[i]] = true
	}
	return out
}

// slotTags is each slot's first tag in shortlex order over [0-9a-z], up to three characters
// ("" for the 85 slots none of them reaches).
var slotTags = sync.OnceValue(func() []string {
	const alphabet = "0123456789abcdefghijklmnopqrstuvwxyz"
	tags := make([]string, SlotCount)
	var walk func(prefix []byte, n int)
	walk = func(prefix []byte, n int) {
		if len(prefix) == n {
			if s := crc16(string(prefix)) % SlotCount; tags[s] == "" {
				tags[s] = string(prefix)
			}
			return
		}
		for i := range len(alphabet) {
			walk(append(prefix, alphabet[i]), n)
		}
	}
	for n := 1; n <= 3; n++ {
		walk(make([]byte, 0, 3), n)
	}
	return tags
})
