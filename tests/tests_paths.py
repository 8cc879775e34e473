from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
