"""edgepop topology: PoPs, GPU nodes, cloud regions, user demand and the WAN latency model."""
