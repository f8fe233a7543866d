"""The view's in-memory read model: folded batch by batch, it is exactly the model loaded from RocksDB.

Lookups read only the model (rlmm.read_model), so a fold that drifted from what the WriteBatch stored would
answer differently before and after a restart; these properties pin that it never does.
"""

from __future__ import annotations

import tempfile
from typing import Any

from hypothesis import given
from rlmm_strategies import Scenario, assert_same_answers, histories
from test_rlmm_view_properties import VIEW_SETTINGS, apply_in_batches, batch_cuts

from rlmm.read_model import ReadModel
from rlmm.view import MetadataView


def _canonical(model: ReadModel) -> dict[bytes, Any]:
    return {
        key: (p.tp, p.meta, dict(p.segments), p.delete, dict(p.lineages),
              {epoch: (list(index.starts), dict(index.ids)) for epoch, index in p.index.items() if index.ids})
        for key, p in model.partitions.items()
    }


@VIEW_SETTINGS
@given(histories(), batch_cuts)
def test_the_folded_read_model_is_the_one_loaded_from_rocksdb(scenario: Scenario, cuts: list[int]) -> None:
    with tempfile.TemporaryDirectory() as directory:
        view = MetadataView.open(directory)
        try:
            apply_in_batches(view, scenario.writer.log, cuts)
            folded = _canonical(view.model)
        finally:
            view.close()
        reopened = MetadataView.open(directory)
        try:
            assert _canonical(reopened.model) == folded
            assert_same_answers(scenario, reopened.batch())  # an empty batch reads the loaded model
        finally:
            reopened.close()
