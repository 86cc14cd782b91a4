"""Quantizer factories for te.common.recipe.CustomRecipe (TransformerEngine's
transformer_engine.pytorch.custom_recipes): quantization_recipes_base has one per built-in
recipe, a starting point for factories that change some slots only (quantizer_factories: the
same under TE main's names, and high_precision_factory); quantizer_factory_zoo has TE main's
examples that mix formats by direction."""
