"""BERT's pretraining recipes, by name: overrides of `pretrain`'s settings (train/pretrain.py PretrainSettings)
beside a budget's steps, batch and learning rate.

  paper   Devlin et al.'s: learned absolute positions, post-LN, MLM + NSP, dropout 0.1.
  rotary  the same with RoFormer's rotary positions (Su et al., 2021): each head's queries and keys
          turned by their position, so that attention to neighbours, what a masked token most needs,
          is there from the first step. bench/bench_recipes.py measured it to learn fastest of the
          probes on 2 CPU cores (bench/README.md, "What pretraining learns"); its checkpoints are
          RoFormer's, which transformers loads.

`demo` and `compare` take one with --recipe (the default: DEFAULT), and so does `pretrain` (train/pretrain.py
with_recipe: no --recipe there is the paper's, a checkpoint transformers' BertForPreTraining loads).
"""

RECIPES: dict[str, dict[str, object]] = {"paper": {}, "rotary": {"positions": "rotary"}}
TEXT = {"paper": "the paper's recipe: learned absolute positions, MLM + NSP",
        "rotary": "rotary positions (RoFormer), otherwise the paper's recipe (MLM + NSP)"}
DEFAULT = "rotary"
