"""The network clients: fsspec with retries, chute's own HTTP and S3 GETs read in its download threads."""
