import json
import sys

try:
    data = json.load(open("data.json"))
except ValueError:
    sys.exit(1)
if data != {"users": [{"name": "ada", "age": 36}, {"name": "linus", "age": 29}], "count": 2}:
    sys.exit(1)
