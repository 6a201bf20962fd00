"""The chapters' toy models and experiments, one module per toy: each chapter and its companion page import the same seeded code."""
