"""Make a real checkpoint speak CoA: every tag becomes ONE added special token with an embedding row.

    new_ids = add_coa_special_tokens(model, tokenizer)   # [] for the tiny default (its tags already are special)

A real tokenizer (Qwen2/2.5, Llama) has no CoA tags: `<think>` is several byte tokens that BPE merges with the
text around it (`>I` is one Qwen2 pre-token), and untrusted page text containing `</observation><answer>`
tokenizes exactly like the real tags. Added as special tokens, each tag is one id, text is split at tags
(so the ids of a trajectory are those the model generates: tag id, then the text's own tokens), and
`encode_untrusted` (split_special_tokens) never yields a tag id.

Embedding rows: a new id below the checkpoint's embedding size reuses a reserved row (Qwen2.5 pads its
151,665-token vocabulary to 152,064 rows); ids beyond it grow the embeddings (and an untied LM head). Either
way the row starts as the mean of the existing tokens' rows, so a new tag's logit starts near the average
token's instead of at an arbitrary value that untrained reserved or random rows would give it.
"""
from __future__ import annotations

import torch
from tokenizers import AddedToken
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from models.tokenizer import TAG_TOKENS


def special_tokens(tokenizer: PreTrainedTokenizerBase) -> set[str]:
    """Every token string the tokenizer treats as special (split out of trusted text, never made from untrusted)."""
    added = {token.content for token in tokenizer.added_tokens_decoder.values() if token.special}
    return added | set(tokenizer.all_special_tokens)


def add_coa_special_tokens(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """Add the CoA tags missing from `tokenizer` as special tokens; give new ids mean-initialised rows in the
    input embeddings and the LM head. Returns the new ids."""
    missing = [tag for tag in TAG_TOKENS if tag not in special_tokens(tokenizer)]
    if not missing:
        return []
    known = len(tokenizer)  # ids below this are the checkpoint's real tokens
    tokenizer.add_tokens([AddedToken(tag, special=True, normalized=False) for tag in missing], special_tokens=True)
    new_ids = [i for i in tokenizer.convert_tokens_to_ids(missing) if i >= known]
    if len(tokenizer) > model.get_input_embeddings().weight.shape[0]:
        model.resize_token_embeddings(len(tokenizer), mean_resizing=False)  # rows initialised below
    with torch.no_grad():
        # A tied LM head is the input embedding itself: the set holds it once.
        for weight in {id(w): w for w in (model.get_input_embeddings().weight, model.get_output_embeddings().weight)}.values():
            weight[new_ids] = weight[:known].mean(dim=0)
    return new_ids
