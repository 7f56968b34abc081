"""TopoEP: deterministic, host-sync-free expert balancing for MoE layers.

``topoep.plan`` computes, from per-rank routing counts, which hot experts get replica slots on
which GPUs and how many tokens each source rank sends to each copy (two stages: across hosts,
then inside each host). ``topoep.TopoEPMoE`` / ``topoep.attach`` execute such plans around a
standard MoE layer over any ``torch.distributed`` process group. ``topoep.HomeReplacer`` is
the slow path: it moves home experts (a permutation over ranks) when a ``ReplacementPolicy``
says so, which the wrapper applies between steps (``TopoEPMoE.rebalance``).
"""
from .adapters import ExpertsSpec, register_adapter
from .checkpoint import stock_state_dict
from .moe import SimpleMoE, TopoEPMoE, attach, home_plan, moe_layers
from .parallel import expert_parameters, prepare
from .planner import TopoEPPlan, TopoEPPlanner, cross_host_fraction, default_placement, plan
from .policy import ReplacementClock, ReplacementPolicy
from .replace import HomeReplacer

__all__ = ["ExpertsSpec", "expert_parameters", "moe_layers", "prepare", "register_adapter",
           "stock_state_dict", "HomeReplacer", "ReplacementClock", "ReplacementPolicy", "SimpleMoE", "TopoEPMoE",
           "TopoEPPlan", "TopoEPPlanner", "attach", "cross_host_fraction",
           "default_placement", "home_plan", "plan"]
