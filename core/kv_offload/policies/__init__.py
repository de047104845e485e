"""Building blocks shared by eviction policies."""
