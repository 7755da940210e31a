"""Metric learning (ITML, explicit and kernelized) and learned metrics as objects."""

from lshdist.metric.itml import ITML, KernelITML
from lshdist.metric.learned import ExplicitMetric, ImplicitMetric

__all__ = ["ITML", "ExplicitMetric", "ImplicitMetric", "KernelITML"]
