/* cuwarden tests: an empty library for `cuwarden run --lib` to preload. */
int cuwt_empty_preload_marker = 1;
