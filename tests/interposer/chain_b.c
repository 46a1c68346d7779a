/* Interposer tests: the "next" definitions for chain_a's RTLD_NEXT lookups. */
int cuWtChainTarget(void) { return 2; }
int xwt_chain_target(void) { return 2; }
