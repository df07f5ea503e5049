"""The naive server a user would write: `transformers.pipeline("text-classification")` on a merged model
directory behind one FastAPI route, one request at a time. The baseline of benchmarks/serve_bench.py.

    python3 benchmarks/naive_server.py MERGED_DIR PORT
"""

import sys
import threading

import uvicorn
from fastapi import FastAPI
from pydantic import BaseModel
from transformers import pipeline

classifier = pipeline("text-classification", model=sys.argv[1], trust_remote_code=True)
one_at_a_time = threading.Lock()
app = FastAPI()


class Request(BaseModel):
    input: str


@app.post("/classify")
def classify(request: Request):
    with one_at_a_time:
        result = classifier(request.input)[0]
    return {"data": [{"index": 0, "label": result["label"], "score": result["score"]}]}


@app.get("/health")
def health():
    return {"status": "ok"}


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
