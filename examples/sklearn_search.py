"""A scikit-learn grid search whose fits run as fnmap calls: ``python examples/sklearn_search.py``.

With no configuration the fits run on the embedded emulator; the same code runs them on Lambda
with ``FNMAP_BACKEND=aws`` (see docs/deploy.md, "Run on AWS").  The digits data set ships with scikit-learn.
"""

import time

import joblib
from sklearn.datasets import load_digits
from sklearn.model_selection import GridSearchCV
from sklearn.svm import SVC

import fnmap.joblib  # registers joblib's "fnmap" backend

X, y = load_digits(return_X_y=True)
grid = {"C": [1, 10, 100, 1000], "gamma": [1e-5, 3e-5, 1e-4, 3e-4, 1e-3]}  # 20 candidates, quick fits

backend = fnmap.joblib.FnmapBackend()  # or backend="fnmap" with fnmap options in parallel_config
start = time.perf_counter()
with joblib.parallel_config(backend=backend, n_jobs=-1):
    search = GridSearchCV(SVC(), grid, cv=5).fit(X, y)  # 5 folds x 20 candidates = 100 fits
print(f"best {search.best_params_}, accuracy {search.best_score_:.3f}, in {time.perf_counter() - start:.1f} s")
job = backend.jobs[0]
summary = job.record()["summary"]
print(f"fnmap job {job.id}: {summary['calls']} calls, {summary['retries']} retries, {summary['bytes_in'] / 1e6:.1f} MB "
      f"sent to them (X, {X.nbytes / 1e6:.1f} MB, stored once); `fnmap job {job.id[:8]}` shows it")
