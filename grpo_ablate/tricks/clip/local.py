"""Family `clip`, the logit regression LOCAL (Local-Curvature Advantage Logit Regression, verl): the sampled
token's logit, centred on pi_old's top-K, regressed onto eta * A instead of a ratio surrogate.

    psi_theta(a) = z_theta(a) - sum_{b in T} pbar(b) z_theta(b)
    loss_t       = 1/2 (psi_theta(a_t) - psi_old(a_t) - eta A_t)^2

T is pi_old's top-K at the token's state and pbar pi_old's probabilities renormalised on T; z the
temperature-scaled logits (those of the distribution sampled). As pbar sums to 1, the log-partition
cancels and psi is also log pi(a) - sum_b pbar(b) log pi(b): the trainer computes it from the forward's
log-probs (train/forward.py), which is why the option's data arguments are the family's (logp, old_logp):
for this option the trainer hands the centred log-probs psi_theta and psi_old in their place (its
`centres_on_old_topk` flag; T and pbar come from pi_old's forward, or from the update's own forward,
detached, when pi_old is the policy itself: one optimizer step per rollout).
"""
from __future__ import annotations

from grpo_ablate.tricks.torch_on_first_use import torch  # imported when a trick runs

from grpo_ablate.tricks.conditions import one_optimizer_step
from grpo_ablate.tricks.registry import POSITIVE, Activity, Inert, Trick, register

# the embedded tiny models' vocabulary: 3 special tokens and the arithmetic task's 14 characters
# (tests/test_local_loss.py checks it against the tokenizer): a top-K of at least this many is all of it
EMBEDDED_VOCABULARY = 17

SOURCE = ("verl verl/trainer/ppo/local_logit_regression.py, verl/workers/utils/losses.py `ppo_loss` and "
          "verl/workers/config/actor.py `PolicyLossConfig` (local_eta 1.0, local_topk 64) at verl-project/verl "
          "38d50c4af7730a99cf9dc396b2010c54e61fea32 (in the code index only: no PR, no paper)")


def old_topk_support(log_probs: torch.Tensor, k: int):
    """pi_old's top-K support of each state: (ids [..., K], pbar [..., K], mass [...]).

    log_probs [..., V]: pi_old's temperature-scaled log-probs (no gradient). pbar = pi_old(b) /
    sum_{c in T} pi_old(c), the softmax of the top-K log-probs (verl `compute_old_topk_features`);
    mass = sum_{b in T} pi_old(b), what the top-K holds of pi_old (verl's `actor/local_topk_mass`).
    K is clipped to the vocabulary, as verl's is. A token the scored distribution excludes (a
    sampler's kept set under rollout.sampling_replay, log-prob -inf) gets pbar 0."""
    with torch.no_grad():
        top, ids = log_probs.topk(min(int(k), log_probs.shape[-1]), dim=-1)
        return ids, torch.softmax(top, dim=-1), top.exp().sum(dim=-1)


def centred_logprob(log_probs: torch.Tensor, tokens: torch.Tensor, ids: torch.Tensor, pbar: torch.Tensor):
    """psi(a) = log pi(a) - sum_{b in T} pbar(b) log pi(b) [...], with the gradient of log_probs [..., V].

    Equal to z(a) - sum_b pbar(b) z(b) (verl `compute_topk_centered_logits`): pbar sums to 1, so the
    log-partition of z cancels, and psi is unchanged by any per-state constant added to the logits. Its
    gradient in the logits is e_a - pbar (pbar 0 outside T). tokens [...]: the sampled tokens a;
    ids, pbar [..., K]: `old_topk_support`'s."""
    pbar = pbar.detach()
    support = log_probs.gather(-1, ids).masked_fill(pbar == 0, 0.0)   # 0 * -inf would be NaN
    return log_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) - (pbar * support).sum(dim=-1)


def full_support_at_unit_scale(cfg) -> bool:
    """One optimizer step on the embedded model, eta = 1 and K at least its vocabulary: T is the whole
    vocabulary, pbar = pi_old = pi_theta, and the gradient -eta A (e_a - pbar) is the policy gradient
    -A (e_a - pi), the default loss's at rho = 1."""
    return (one_optimizer_step(cfg) and cfg.model.get("path") is None and float(cfg.clip.eta) == 1.0
            and int(cfg.clip.topk) >= EMBEDDED_VOCABULARY)


def _centres_on_pi_old(cfg) -> str | None:
    """LOCAL centres on pi_old's own forward (verl's old-log-prob pass); a proximal option that puts
    another policy in pi_old's place has no top-K to centre on, and the gradient-conflict diagnostics
    forward log-probs, not the centred ones."""
    proximal = cfg.get("proximal")
    if proximal is not None and proximal.name != "recompute":
        return (f"clip=local centres on pi_old's top-K from pi_old's own forward; proximal={proximal.name} "
                "puts another policy in its place, which has no top-K here; use proximal=recompute")
    diag = cfg.get("diag")
    if diag is not None and bool(diag.get("grad_conflict", False)):
        return ("clip=local's policy term reads the centred log-probs, which the gradient-conflict diagnostics "
                "do not forward; use diag.grad_conflict=false")
    return None


@register("clip", "local",
          what="LOCAL, local-curvature logit regression (verl loss_mode=local): 1/2 (psi_theta - psi_old - eta A)^2, "
               "psi the sampled logit centred on pi_old's top-K; no ratio, no clip",
          notes={"eta": "verl policy_loss.local_eta: the logit displacement regressed onto eta * A",
                 "topk": "verl policy_loss.local_topk: the size K of pi_old's support the logits are centred on"},
          centres_on_old_topk=True,   # read by the trainer: the loss takes psi, not log-probs (train/losses.py)
          knobs={"eta": POSITIVE},
          defaults={"topk": 64},
          inert=Inert(full_support_at_unit_scale,
                      "is the policy gradient with one optimizer step, eta = 1 and K at least the embedded model's "
                      "17-token vocabulary (pbar = pi: the gradient -A (e_a - pi))",
                      "set clip.topk=4, clip.eta=2 or updates.mini_batches=4",
                      "K below the vocabulary, eta != 1, or several optimizer steps per rollout"),
          activity=Activity("local/residual_sq"),
          writes=("local/residual_sq", "local/feature_delta_abs", "local/target_abs", "clip/topk_mass"),
          checks=_centres_on_pi_old,
          tricks=(Trick("local_logit_regression",
                        what="LOCAL: regress the sampled token's logit, centred on pi_old's top-64, onto eta * A "
                             "(a squared loss in the logits instead of PPO's clipped ratio)",
                        source=SOURCE, verdict="not_in_review",
                        cost="pi_old's top-K ids and weights per token (K = 64: 64 ints and 64 floats a token)"),))
def local_loss(logp, old_logp, advantages, mask, *, eta: float = 1.0):
    """LOCAL (Local-Curvature Advantage Logit Regression): the sampled token's centred logit regressed
    onto the scaled advantage, a squared loss per token.

        psi(a_t)  = z(a_t) - sum_{b in T_t} pbar_t(b) z(b)        (T_t: pi_old's top-K at token t)
        delta_t   = psi_theta(a_t) - sg(psi_old(a_t)) - eta sg(A_t)
        loss_t    = 1/2 delta_t^2,   d loss_t / d z_theta = delta_t (e_{a_t} - pbar_t)

    `logp`, `old_logp` are psi_theta and psi_old (the trainer hands them for this option, see the module
    docstring); aggregated by loss_agg (verl: agg_loss with the actor's loss_agg_mode, token-mean by
    default); rollout_correction's weights multiply loss_t (verl's rollout_is_weights). At pi_old
    delta = -eta A: the gradient -eta A (e_a - pbar), the policy gradient's with pi replaced by pbar.
    Reference: verl `compute_policy_loss_local`, `compute_old_topk_features` and
    `compute_topk_centered_logits` (verl/trainer/ppo/local_logit_regression.py at 38d50c4a), with
    policy_loss.local_eta 1.0 and local_topk 64 (PolicyLossConfig); T and pbar from verl's
    old-log-prob pass (pi_old's recompute), logits after temperature. No ratio, no clip, no extra
    term. Statistics (verl's actor/local_*): `local/residual_sq` delta^2, `local/feature_delta_abs`
    |psi_theta - psi_old| (0 on a rollout's first optimizer step), `local/target_abs` |eta A|; the
    trainer adds `clip/topk_mass`, what T holds of pi_old (verl's local_topk_mass; 1: K covers pi_old).
    """
    target = eta * advantages.detach()
    feature_delta = logp - old_logp.detach()
    residual = feature_delta - target
    loss = 0.5 * residual.square()
    with torch.no_grad():
        stats = {"local/residual_sq": residual.square().expand_as(loss),
                 "local/feature_delta_abs": feature_delta.abs().expand_as(loss),
                 "local/target_abs": target.abs().expand_as(loss)}
    return loss, stats
