import sys
from pathlib import Path

# train.py lives at the project root.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
