package adapters

import "strings"

// KeySlot is the Redis Cluster hash slot of key: CRC16 (XMODEM) of its hash tag (the part
// between the first "{" and the next "}", when not empty) or of the whole key, mod 16384.
// Keys of one slot may be touched by one script; keys of different slots may not.
func KeySlot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	return int(crc16(key) % 16384)
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
