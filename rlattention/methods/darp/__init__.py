"""Deep reinforced attention regression for on-the-fly partial-sketch image retrieval (DARP-SBIR): Wang et al.,
"Deep Reinforced Attention Regression for Partial Sketch Based Image Retrieval" (ICDM 2021), plus the
baselines of its Table III in the same framework.

Data layout (``rlattention.data.readers.sketch_retrieval``): an item is ``(S + 3, H, W)``: the S partial renders of
one query sketch (completion steps 1..S, ink 1 on 0) followed by its true photo (RGB); the target is the
photo's index in the dataset's photo list. A prediction is ``(S * D + D)``: the sketch embedding after each
completion step, then the photo embedding; :meth:`SketchRetrievalMethod.metrics` deduplicates the photos of
a split into its gallery and ranks every (query, step) against it (``rlattention.metrics.sketch``).

Methods registered here:

``darp_triplet`` (phase 1, and the "triplet network" row): sketch and photo CNNs (shared or per domain) ->
    soft spatial attention pooling -> 64-d FC -> L2 normalisation, trained with the triplet loss (eq. 1)
    ``max(0, mu + d(a, p) - d(a, n))`` on (complete sketch, its photo, another photo). After training it
    writes ``phase1.safetensors``: both networks and the gallery embeddings e_i of every photo.
``darp`` (phase 2): glimpse network on the current partial sketch -> RNN -> action network a_t (a 64-d
    sketch embedding, supervised loss ||a_t - e_i||^2) and a locator. ``locator: bootstrap`` is the paper's
    K-head Gaussian locator trained by the bootstrapped policy gradient (eq. 8) with the dynamic ranking
    reward (eqs. 3-5); ``locator: dqn`` is the bootstrapped-DQN baseline (K Q-heads over a grid of
    locations). ``baseline: true`` adds a learned baseline (our improvement; off in the paper).
``darp_policy`` ("triplet + vanilla RL" and "triplet + PPO", after Bhunia et al., "Sketch Less for More",
    CVPR 2020): a policy network maps the frozen phase-1 features of each partial sketch to a Gaussian over
    the sketch embedding, trained by REINFORCE (``algorithm: reinforce``) or by PPO's clipped surrogate over
    a replay memory with a Monte-Carlo value network (``algorithm: ppo``).

Time in ``darp``: an episode is one sketch drawn on the fly. At each completion step s = 1..S the agent takes
``glimpses_per_step`` glimpses of the s-th partial render; the hidden state and the glimpse location carry over
from one completion step to the next. Every glimpse t gives an embedding a_t and a reward R_t; the location
v_t chosen after glimpse t is rewarded by the discounted return of R_{t+1}.. (eq. 6). The embedding reported
for completion step s is a_t at its last glimpse.

Modules: :mod:`.layout` (the item and prediction layouts and the retrieval metrics the three share),
:mod:`.phase1` (``darp_triplet``: the embedding networks and the triplet loss), :mod:`.frozen` (phase 1 as phase 2
reads it: the artifact, its memo, and the base of the phase-2 methods), :mod:`.phase2` (``darp``: the glimpse
agent and its losses), :mod:`.locators` (the DQN and raster locators' grids and choices), :mod:`.policy`
(``darp_policy``: the REINFORCE and PPO policy baselines).
"""

from rlattention.methods.darp.frozen import (
    PartialMemo,
    Phase1,
    Phase2Method,
    load_phase1,
    phase1_from_state,
    training_gallery,
)
from rlattention.methods.darp.layout import SketchRetrievalMethod, completion_steps, split_layout
from rlattention.methods.darp.locators import cell_centres, raster_locations
from rlattention.methods.darp.phase1 import PHASE1_FILE, PHASE1_FORMAT, EmbeddingNet, TripletConfig, TripletNetwork
from rlattention.methods.darp.phase2 import DARP, DARP_REWARDS, DARPConfig
from rlattention.methods.darp.policy import EmbeddingPolicy, PolicyConfig

__all__ = [
    "DARP",
    "DARP_REWARDS",
    "PHASE1_FILE",
    "PHASE1_FORMAT",
    "DARPConfig",
    "EmbeddingNet",
    "EmbeddingPolicy",
    "PartialMemo",
    "Phase1",
    "Phase2Method",
    "PolicyConfig",
    "SketchRetrievalMethod",
    "TripletConfig",
    "TripletNetwork",
    "cell_centres",
    "completion_steps",
    "load_phase1",
    "phase1_from_state",
    "raster_locations",
    "split_layout",
    "training_gallery",
]
