"""The cost vector of one candidate: the slots ``kernels.training.row_costs`` fills.

The analytic tier (``kernels.training.evaluate_one``) and the event tier
(``kernels.event_tier``) read the same slots, so both rank the same operator
and collective costs.
"""

from __future__ import annotations

#: Cost components of one candidate (``row_costs``), seconds unless noted:
#: per layer per micro-batch forward/backward compute, its TP collectives
#: exposed in the forward (and, last slot, in the backward), exposed CP ring
#: time, recompute added to the backward, the embedding and the LM head + loss with their TP traffic, one pipeline
#: message, the device's whole gradient reduction and parameter gather (ZeRO-3:
#: one pass's), the optimizer step, logits per micro-batch (elements), the
#: largest stage's parameters (count), and the weight-gradient GEMMs inside the
#: layer's and the head's backward (the W half that zero-bubble schedules split off).
#: MoE layers: forward / backward compute, their weight-gradient GEMMs, exposed
#: EP communication forward / backward, and the MoE buffers' bytes. The
#: multi-token-prediction modules' forward / backward / W on the last stage. One
#: dispatch of one MoE layer's micro-batch with its local passes, and the routed
#: rows per expert of the busiest rank with the gate/up GEMM's efficiency at them.
#: Exposed host-link time per layer and micro-batch (dense D / MoE M, forward F /
#: backward B) with activations and weights offloaded (OFF) and with only the
#: weights (WOFF, the layers whose activations are recomputed instead). An MoE
#: layer's recompute added to the backward: compute, and EP communication.
#: One MoE layer's raw EP traffic per micro-batch (dispatch, combine; nothing
#: overlapped) and its expert compute (routed + shared experts) forward,
#: backward, and the weight-gradient GEMMs inside that backward: the event tier
#: runs the traffic as tasks between the compute (``kernels.event_tier``).
(
    C_LAYER_FWD, C_LAYER_BWD, C_TP_LAYER, C_CP_F, C_CP_B, C_RC_COMPUTE, C_RC_COMM, C_EMB_F, C_EMB_B, C_EMB_COMM,
    C_HEAD_F, C_HEAD_B, C_HEAD_COMM, C_P2P, C_DP_GRAD, C_DP_PARAM, C_OPT, C_LOGITS, C_PARAMS_MAX,
    C_LAYER_WGRAD, C_HEAD_WGRAD, C_MOE_FWD, C_MOE_BWD, C_MOE_WGRAD, C_EP_F, C_EP_B, C_MOE_BUFFER,
    C_MTP_F, C_MTP_B, C_MTP_W, C_DISPATCH, C_EROWS, C_EEFF,
    C_OFF_DF, C_OFF_DB, C_OFF_MF, C_OFF_MB, C_WOFF_DF, C_WOFF_DB, C_WOFF_MF, C_WOFF_MB,
    C_RC_MOE, C_RC_EP, C_EP_DISP, C_EP_COMB, C_EXPERT_F, C_EXPERT_B, C_EXPERT_W, C_TP_LAYER_B,
) = range(49)
N_COST = 49
