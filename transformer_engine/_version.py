"""The one place the version is written (setup.py reads this file without importing the package).

Clients gate their TransformerEngine code on the version (Megatron-Core's is_te_min_version,
accelerate's and Lightning's requirement checks), so __version__ is the TransformerEngine
release whose PyTorch API this package implements, with our own release as the PEP 440 local
label: "2.8.0+portable.0.2.0" compares as 2.8.0 in every version check and still says what it is.
"""
TE_API_LEVEL = "2.8.0"  # the TransformerEngine release whose API clients may rely on
PORTABLE_RELEASE = "0.2.0"  # this project's own release
__version__ = f"{TE_API_LEVEL}+portable.{PORTABLE_RELEASE}"
