"""Training: state, optimizer, the pure train step, data parallelism, checkpoints, the loop."""

from attnjax.train.loop import check_scored, evaluate, format_summary, train
from attnjax.train.parallel import Runner
from attnjax.train.state import TrainState, init_state
from attnjax.train.step import make_eval_step, make_train_step
