"""Graphs, plans and their execution."""
from .graph import Graph, build_forward
from .plan import Plan
from .step import Step

__all__ = ["Graph", "build_forward", "Plan", "Step"]
