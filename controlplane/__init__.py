"""edgepop controlplane package."""
