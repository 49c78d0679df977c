"""edgepop sim package."""
