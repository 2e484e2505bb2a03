"""The node cache: shards shared by every process of a node under a byte limit (the protocol: README.md here)."""
