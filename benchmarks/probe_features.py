"""Probe model, warm-up, learning-effect features, clustering and quotas for `benchmarks/probe.py`.

- `fit_probe`: the one probe recipe every arm trains (multinomial logistic regression, L-BFGS, fixed `C`, per-example
  weights rescaled to mean 1 so that weights change the relative, never the total, pull against the L2 penalty);
- `warmup`: a short seeded mini-batch SGD run of the same model on the full pool (the product's warm-up);
- `features`: per-example features from the warm-up model — `badge` = (p − onehot(y)) ⊗ x (dim K·d, projected to
  256 dims with a seeded Gaussian matrix, without forming the outer products), `target` = (p_y − 1)·x (the product's
  feature), `hidden` = x (RDS+-style) — with raw norms (the gradient-norm estimate) and warm-up losses −log p_y;
- `cluster`: the product's clustering (L2-normalise, PCA to 16, HDBSCAN with min_samples=1 and noise assigned by
  membership vectors) or KMeans; returns labels and the 16-d clustering space;
- `quotas`: largest-remainder split of the exact budget in proportion to cluster size.
"""

from __future__ import annotations

import warnings

import numpy as np
from sklearn.cluster import KMeans
from sklearn.decomposition import PCA
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import accuracy_score, f1_score

PROBE_C = 3.0  # chosen once on 20ng (full pool and a 300-example subset, C in 1..100); same everywhere
PROBE_MAX_ITER = 300
WARMUP_STEPS, WARMUP_BATCH, WARMUP_LR = 60, 32, 4.0
PROJ_DIM = 256
PCA_DIM = 16


# ------------------------------------------------------------------------------------------------------- probe
def fit_probe(x: np.ndarray, y: np.ndarray, weights: np.ndarray | None, n_classes: int) -> LogisticRegression:
    """The fixed probe recipe on a (weighted) subset. Classes absent from the subset simply get no logit."""
    w = None if weights is None else np.asarray(weights, dtype=np.float64) / np.mean(weights)
    model = LogisticRegression(C=PROBE_C, max_iter=PROBE_MAX_ITER, tol=1e-4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.fit(x, y, sample_weight=w)
    return model


def evaluate(model: LogisticRegression, x: np.ndarray, y: np.ndarray) -> dict[str, float]:
    pred = model.predict(x)
    return {"acc": float(accuracy_score(y, pred)), "f1": float(f1_score(y, pred, average="macro", zero_division=0))}


# ------------------------------------------------------------------------------------------------------ warm-up
def _softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def warmup(x: np.ndarray, y: np.ndarray, n_classes: int, seed: int, steps: int = WARMUP_STEPS,
           batch: int = WARMUP_BATCH, lr: float = WARMUP_LR) -> tuple[np.ndarray, np.ndarray]:
    """Short mini-batch SGD on the mean cross-entropy from a small seeded random init; returns (W [d, K], b [K])."""
    rng = np.random.default_rng(seed)
    n, d = x.shape
    w = rng.normal(0.0, 0.01, size=(d, n_classes))
    b = np.zeros(n_classes)
    onehot = np.eye(n_classes)[y]
    order = rng.permutation(n)
    for step in range(steps):
        if (step + 1) * batch > order.size:
            order = np.concatenate([order[step * batch:], rng.permutation(n)])
        idx = order[(step * batch) % order.size:][:batch]
        err = _softmax(x[idx] @ w + b) - onehot[idx]
        w -= lr * x[idx].T @ err / idx.size
        b -= lr * err.mean(axis=0)
    return w, b


def features(x: np.ndarray, y: np.ndarray, model: tuple[np.ndarray, np.ndarray], seed: int) -> dict[str, np.ndarray]:
    """Learning-effect features of every pool example under the warm-up model.

    Returns `badge`, `target`, `hidden` (feature matrices), `norm_badge` (= ||p − onehot(y)||·||x||, the exact norm
    of the last-layer gradient), `norm_target` (= (1 − p_y)·||x||), `loss` (−log p_y) and `p_y`.
    """
    w, b = model
    n, d = x.shape
    k = w.shape[1]
    p = _softmax(x @ w + b)
    err = p - np.eye(k)[y]
    rng = np.random.default_rng(seed + 7919)
    proj = rng.normal(0.0, 1.0 / np.sqrt(PROJ_DIM), size=(d, k * PROJ_DIM)).astype(np.float32)
    xr = (x.astype(np.float32) @ proj).reshape(n, k, PROJ_DIM)  # row n: x_n · R_k for every class k
    badge = np.einsum("nk,nkr->nr", err.astype(np.float32), xr)  # = vec(err ⊗ x) · R
    p_y = p[np.arange(n), y]
    xnorm = np.linalg.norm(x, axis=1)
    return {
        "badge": badge.astype(np.float64),
        "target": (p_y - 1.0)[:, None] * x,
        "hidden": x.astype(np.float64),
        "norm_badge": np.linalg.norm(err, axis=1) * xnorm,
        "norm_target": (1.0 - p_y) * xnorm,
        "loss": -np.log(np.maximum(p_y, 1e-12)),
        "p_y": p_y,
    }


# --------------------------------------------------------------------------------------------------- clustering
def clustering_space(feat: np.ndarray, seed: int) -> np.ndarray:
    """L2-normalise the rows, then seeded PCA to `PCA_DIM` dims (the product's reduction)."""
    norms = np.linalg.norm(feat, axis=1, keepdims=True)
    unit = np.divide(feat, norms, out=np.zeros_like(feat), where=norms > 0)
    dim = min(PCA_DIM, unit.shape[0] - 1, unit.shape[1])
    return np.ascontiguousarray(PCA(n_components=dim, random_state=seed).fit_transform(unit), dtype=np.float64)


def hdbscan_labels(points: np.ndarray) -> np.ndarray:
    """The product's HDBSCAN: min_samples=1, min_cluster_size=clamp(round(√n/2.5), 5, 100), single-cluster refit if
    all noise, noise points to their most probable cluster (`all_points_membership_vectors`)."""
    import hdbscan

    n = points.shape[0]
    mcs = int(min(100, max(5, round(np.sqrt(n) / 2.5))))
    kwargs = dict(min_cluster_size=mcs, min_samples=1, prediction_data=True, core_dist_n_jobs=1)
    model = hdbscan.HDBSCAN(**kwargs).fit(points)
    if (model.labels_ < 0).all():
        model = hdbscan.HDBSCAN(allow_single_cluster=True, **kwargs).fit(points)
    labels = np.asarray(model.labels_, dtype=np.int64).copy()
    found = int(labels.max()) + 1
    noise = np.flatnonzero(labels < 0)
    if noise.size and found == 1:
        labels[noise] = 0
    elif noise.size:
        member = np.asarray(hdbscan.all_points_membership_vectors(model), dtype=np.float64).reshape(n, -1)[noise]
        choice = np.argmax(np.nan_to_num(member, nan=-1.0), axis=1)
        bad = ~(np.isfinite(member).all(axis=1) & (np.nan_to_num(member).max(axis=1) > 0))
        if bad.any():
            cents = np.stack([points[labels == c].mean(axis=0) for c in range(found)])
            d2 = ((points[noise[bad], None, :] - cents[None]) ** 2).sum(axis=2)
            choice[bad] = np.argmin(d2, axis=1)
        labels[noise] = choice
    return labels


def kmeans_labels(points: np.ndarray, n_clusters: int, seed: int) -> np.ndarray:
    n_clusters = int(max(1, min(n_clusters, points.shape[0])))
    return KMeans(n_clusters=n_clusters, n_init=1, random_state=seed).fit_predict(points).astype(np.int64)


def refine_by_class(labels: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Split every cluster by class label: one cell per (cluster, class) pair, relabelled 0..K'-1."""
    _, cells = np.unique(labels * (int(y.max()) + 1) + y, return_inverse=True)
    return cells.astype(np.int64)


# ------------------------------------------------------------------------------------------------------ quotas
def quotas(sizes: np.ndarray, budget: int) -> np.ndarray:
    """Largest-remainder (Hamilton) split of `budget` in proportion to `sizes` (ties to the lower position)."""
    sizes = np.asarray(sizes, dtype=np.int64)
    exact = budget * sizes / sizes.sum()
    base = np.floor(exact).astype(np.int64)
    rest = budget - int(base.sum())
    order = np.lexsort((np.arange(sizes.size), -(exact - base)))
    base[order[:rest]] += 1
    return np.minimum(base, sizes)


def nested_quotas(cells: np.ndarray, y: np.ndarray, budget: int) -> np.ndarray:
    """Quotas of (cluster, class) cells, nested: the budget is split over classes first, then each class's share
    over its cells (so splitting clusters by class never starves a rare class). Returns `[n_cells]`."""
    n_cells = int(cells.max()) + 1
    sizes = np.bincount(cells, minlength=n_cells)
    cell_class = np.zeros(n_cells, dtype=np.int64)
    cell_class[cells] = y
    classes, class_sizes = np.unique(y, return_counts=True)
    out = np.zeros(n_cells, dtype=np.int64)
    for c, q in zip(classes, quotas(class_sizes, budget)):
        mine = np.flatnonzero((cell_class == c) & (sizes > 0))
        out[mine] = quotas(sizes[mine], int(q))
    return out
