package command

// Waiters counts the requests waiting in this process for a concurrent request's outcome.
func Waiters(h *RecordCheckinHandler) int { return h.flights.waiters() }
