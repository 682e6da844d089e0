"""``llm.models.base_folder``: the folder an engine loads is keyed by all it holds, so the same
weights under another config get a folder of their own, never a stale ``config.json``."""

import json

from llm_test_support import make_team

from llm.models.base_folder import base_folder
from llm.models.loading import tiny_char_tokenizer


def test_the_same_weights_under_another_config_get_their_own_folder(tmp_path):
    tokenizer = tiny_char_tokenizer()
    model = make_team(len(tokenizer), 2).backbone.model
    first = base_folder(model, tokenizer, cache=tmp_path)
    assert base_folder(model, tokenizer, cache=tmp_path) == first  # reused, not rewritten
    positions = model.config.max_position_embeddings
    model.config.max_position_embeddings = 2 * positions
    second = base_folder(model, tokenizer, cache=tmp_path)
    assert second != first
    written = {
        folder: json.loads((folder / "config.json").read_text()) for folder in (first, second)
    }
    assert written[first]["max_position_embeddings"] == positions
    assert written[second]["max_position_embeddings"] == 2 * positions
