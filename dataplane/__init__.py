"""edgepop dataplane package."""
