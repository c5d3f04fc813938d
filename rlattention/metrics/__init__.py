"""Evaluation metrics: classification, multi-label, retrieval, sketch retrieval, re-identification."""

#: The unit of every accuracy-like figure a method reports (``Method.metrics``, report.json, eval.json, the console,
#: TensorBoard): percentages in 0-100 as the papers print them (rsum: a sum of six, 0-600); counts, ranks and
#: losses are plain numbers. report.json and eval.json record it as ``"units"``: a report without that key was
#: written when some methods reported fractions in [0, 1] (accuracy, multi-label mAP/F1, sketch AUIR/acc@k).
METRIC_UNITS = "percent"
