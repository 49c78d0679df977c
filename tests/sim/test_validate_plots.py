"""The figure of ``edgepop validate`` is drawn from the rows behind the tables, held-out predictions when there are."""

from __future__ import annotations

import numpy as np
import pandas as pd

from sim.validate_plots import draw_fidelity


def test_fidelity_figure_reads_held_out_predictions_when_present(tmp_path):
    service = pd.DataFrame({"phase": ["prefill", "decode", "kernel"], "measured_ms": [100.0, 10.0, 1.0],
                            "fit_ms": [101.0, 9.0, 1.0], "cv_model_ms": [120.0, 8.0, np.nan],
                            "cv_gpu_ms": [90.0, np.nan, 1.1], "cv_tp_ms": [110.0, 11.0, 1.0]})
    wan = pd.DataFrame({"km": np.linspace(0, 15000, 40), "rtt_ms": np.linspace(2, 250, 40)})
    wan["predicted_ms"] = wan.rtt_ms * 1.05
    path = draw_fidelity({"service_time": service, "wan": wan}, tmp_path / "f.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    wan["cv_set_ms"] = wan.rtt_ms * 0.95  # the held-out column is what the right panel plots when present
    import matplotlib.pyplot as plt

    from sim import validate_plots

    fig, ax = plt.subplots()
    validate_plots._wan(ax, wan)
    ratios = ax.collections[0].get_offsets()[:, 1]
    assert np.allclose(ratios, 0.95) and "leave one data set out" in ax.get_title()
    ax.clear()
    validate_plots._service_time(ax, service)
    assert "leave one group out" in ax.get_title() and "(2 engine rows)" in ax.get_title()
    plt.close(fig)
