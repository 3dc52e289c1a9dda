import json
import sys

data = json.load(open("config.json"))
if data != {"name": "demo", "port": 8080}:
    sys.exit(1)
