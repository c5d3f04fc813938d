"""Evaluation metrics: classification, multi-label, retrieval, sketch retrieval, re-identification."""
