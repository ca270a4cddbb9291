"""A trained model put to use: ``Predictor`` (raw frames in, raw predicted frames out, as
``drift.load_exported`` returns it) and ``predict`` (``drift predict``: its predictions for a data file's
trajectories, written back in the file's layout, each rank its blocks; ``write``).
"""

from drift._moved import moved_names
from drift.data.formats.pdebench import TIMES
from drift.predict.predictor import Predictor
from drift.predict.write import ATTRIBUTE, Plan, check_prediction_memory, plan_prediction, predict

__all__ = ["ATTRIBUTE", "TIMES", "Plan", "Predictor", "check_prediction_memory", "plan_prediction", "predict"]

# drift's names the module drift.predict imported (0.1.0): their homes. Source (PDEBench 3-D files and their
# dtype) became the DataFiles of any layout that a Plan holds.
__getattr__ = moved_names(
    __name__,
    {"drift.data": ("FIELDS",), "drift.data.files": ("Data",), "drift.data.pdebench": ("COORDINATES",)},
    renamed={"Source": "drift.data.files.DataFiles"},
)
