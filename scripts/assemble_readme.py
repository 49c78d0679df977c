"""Assemble README.md from its hand-written head and the per-area sections in docs/readme/ (run after editing)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PARTS = ROOT / "docs" / "readme"
ORDER = ["head.md", "sim.md", "sweep.md", "perf.md", "placement.md", "topology_cli.md", "profile.md", "gateway.md",
         "controlplane.md", "workload.md", "dataplane.md", "techniques_sim.md", "techniques_sim_cache.md",
         "techniques_live_prefix.md", "techniques_live_quant.md", "world.md", "notebooks.md", "tail.md"]


def main() -> None:
    parts = [(PARTS / name).read_text().strip() for name in ORDER if (PARTS / name).exists()]
    (ROOT / "README.md").write_text("\n\n".join(parts) + "\n")


if __name__ == "__main__":
    main()
