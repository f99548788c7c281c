package store

// SetPruneBatch makes PruneEvents delete n events per statement, so a test
// can cross batches without thousands of rows.
func SetPruneBatch(n int) (restore func()) {
	old := pruneBatch
	pruneBatch = n
	return func() { pruneBatch = old }
}
