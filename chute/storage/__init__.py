"""Remote storage: fsspec access with retries, the node cache, the downloader, the progressive mode."""
