"""Files and bytes: safe opening, bounded JSON, kernel copies and extents, digests, the commit protocol."""
