"""Mixture-of-experts token plumbing: routing (router.py: top-k with a score function, the
aux-loss scores and loss) and the permutation of tokens to their experts and back
(permutation.py). TE's import paths transformer_engine.pytorch.router and .permutation name
these modules; the expert GEMMs are module/grouped_linear.py."""
