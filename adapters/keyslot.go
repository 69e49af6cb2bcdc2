package adapters

import "github.com/checkins/checkins/app/projection"

// KeySlot is the Redis Cluster hash slot of key: CRC16 (XMODEM) of its hash tag (the part
// between the first "{" and the next "}", when not empty) or of the whole key, mod 16384.
// Keys of one slot may be touched by one script; keys of different slots may not.
func KeySlot(key string) int { return projection.KeySlot(key) }
