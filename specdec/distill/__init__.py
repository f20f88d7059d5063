"""`specdec distill`: train a small draft model for a target by self-distillation.

corpus.py  prompts (shipped chat prompts + stdlib docstrings), a fixed held-out split
data.py    the target generates continuations; token ids + its top-k logits, chunked, resumable
train.py   train the draft's own layers (embedding / head frozen, shared with the target)
evaluate.py  held-out greedy speculative decoding at k = 4 through specdec.engine
cli.py     the subcommand
"""
