"""Drives the official OpenAI and Anthropic Python SDKs (and LiteLLM) against a base URL for
wasm-test/tests/sdk.rs, and prints one JSON object with what the SDK returned or raised.

    python driver.py <scenario> --base-url http://127.0.0.1:PORT [--tenant T] [--max-tokens N]
                     [--max-retries N] [--header k=v ...] [--model M] [--thinking-budget N]
                     [--sleep-before S]
                     [--tool-properties a,b,c]
    python driver.py batch     # stdin: a JSON list of argument lists; prints a JSON list of results

Scenarios (admitted calls):
  openai-chat, openai-chat-stream, openai-chat-stream-usage, openai-completions,
  openai-completions-stream, openai-embeddings, openai-responses, openai-responses-stream,
  anthropic-messages, anthropic-messages-stream, litellm-chat
Scenarios (refusals, report the SDK's exception):
  openai-error (a chat call), anthropic-error (a messages call), litellm-router-error,
  openai-batches-error (batches.create), anthropic-batches-error (messages.batches.create),
  openai-responses-background (responses.create with background=True; also admitted when configured)
Other: anthropic-count-tokens (messages.count_tokens; reports the HTTP status)
Scenarios of the other families (--model: the Azure deployment, Gemini model or Bedrock model id;
--max-retries N also turns on google-genai's retries, which are off by default):
  azure-chat, azure-chat-stream, azure-error (openai.AzureOpenAI, /openai/deployments/{model}/…;
    --no-stream-usage: a stream without stream_options.include_usage)
  azure-v1-chat, azure-v1-chat-stream (Azure's v1 API as Microsoft documents it: openai.OpenAI with
    base_url {endpoint}/openai/v1, the deployment as the body's model)
  gemini-generate, gemini-stream, gemini-count-tokens, gemini-error (google-genai, Gemini API key mode)
  vertex-generate, vertex-stream, vertex-error (google-genai, Vertex AI mode, fake OAuth credentials)
  bedrock-converse, bedrock-converse-stream, bedrock-error (boto3 bedrock-runtime, fake SigV4 credentials,
    retry mode standard with --max-retries retries)

Output on success: {"ok": true, "text": ..., "usage": {...}, "elapsed": s, ...}
Output on an SDK exception: {"ok": false, "exception": "RateLimitError", "classes": [...MRO names],
  "status_code": 429, "code": ..., "type": ..., "param": ..., "request_id": ..., "error_code": ...,
  "retries_taken": n, "elapsed": s}
The SDK's own retry log lines ("Retrying request to ... in N seconds") go to stderr.
"""

import argparse
import json
import logging
import sys
import time


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("scenario")
    p.add_argument("--base-url", required=True)
    p.add_argument("--tenant", default="sdk")
    p.add_argument("--model", default=None)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--max-retries", type=int, default=2)
    p.add_argument("--header", action="append", default=[])
    p.add_argument("--prompt", default="Say hello.")
    p.add_argument("--sleep-before", type=float, default=0.0, help="seconds to wait before the call")
    p.add_argument("--thinking-budget", type=int, default=None)
    p.add_argument("--tool-properties", default=None, help="comma-separated property names of a tool schema")
    p.add_argument("--no-stream-usage", action="store_true", help="azure streams: no include_usage")
    p.add_argument("--api-key", default=None, help="the client's key (Bedrock: the access key id)")
    p.add_argument("--key-in-query", action="store_true", help="google-genai: the API key as ?key=")
    return p.parse_args()


def headers_of(args):
    h = {"x-tenant-id": args.tenant} if args.tenant else {}
    for kv in args.header:
        k, _, v = kv.partition("=")
        h[k] = v
    return h


def openai_client(args):
    import openai

    return openai.OpenAI(
        base_url=args.base_url + "/v1",
        api_key="sk-test",
        max_retries=args.max_retries,
        default_headers=headers_of(args),
        timeout=30,
    )


def anthropic_client(args):
    import anthropic

    return anthropic.Anthropic(
        base_url=args.base_url,
        api_key="sk-ant-test",
        max_retries=args.max_retries,
        default_headers=headers_of(args),
        timeout=30,
    )


def azure_client(args):
    import openai

    return openai.AzureOpenAI(
        azure_endpoint=args.base_url,
        api_key=args.api_key or "azure-test-key",
        api_version="2024-10-21",
        max_retries=args.max_retries,
        default_headers=headers_of(args),
        timeout=30,
    )


def azure_v1_client(args):
    import openai

    # Azure OpenAI's v1 API takes the OpenAI client itself (no api-version, the deployment as `model`).
    return openai.OpenAI(
        base_url=args.base_url + "/openai/v1",
        api_key="azure-test-key",
        max_retries=args.max_retries,
        default_headers=headers_of(args),
        timeout=30,
    )


def genai_client(args, vertex):
    from google import genai
    from google.genai import types

    retry = None
    if args.max_retries > 0:
        # google-genai retries only when asked to (HttpRetryOptions), on 408, 429 and 5xx, with its
        # own exponential backoff: it reads no retry header.
        retry = types.HttpRetryOptions(
            attempts=args.max_retries + 1, initial_delay=0.05, max_delay=0.2, jitter=0.0
        )
    client_args = None
    if args.key_in_query:
        # The API key as Google also reads it: the `key` query parameter instead of x-goog-api-key.
        def key_to_query(request):
            key = request.headers.pop("x-goog-api-key", None)
            if key is not None:
                request.url = request.url.copy_add_param("key", key)

        client_args = {"event_hooks": {"request": [key_to_query]}}
    http = types.HttpOptions(
        base_url=args.base_url,
        headers=headers_of(args),
        retry_options=retry,
        timeout=30_000,
        client_args=client_args,
    )
    if vertex:
        from google.oauth2.credentials import Credentials

        # A token that never expires: the SDK sends it as is and never refreshes it (no network).
        return genai.Client(
            vertexai=True,
            project="tg-project",
            location="us-central1",
            credentials=Credentials(token=args.api_key or "fake-oauth-token"),
            http_options=http,
        )
    return genai.Client(api_key=args.api_key or "fake-gemini-key", http_options=http)


def bedrock_client(args):
    import boto3
    from botocore.config import Config

    client = boto3.client(
        "bedrock-runtime",
        region_name="us-east-1",
        endpoint_url=args.base_url,
        aws_access_key_id=args.api_key or "AKIDEXAMPLEFAKE",
        aws_secret_access_key="fake-secret-key",
        config=Config(
            # botocore's `max_attempts` here counts retries (`total_max_attempts` would count all).
            retries={"max_attempts": args.max_retries, "mode": "standard"},
            read_timeout=30,
            connect_timeout=5,
        ),
    )
    extra = headers_of(args)

    def add_headers(request, **_):
        for k, v in extra.items():
            request.headers[k] = v

    client.meta.events.register("before-sign.bedrock-runtime.*", add_headers)
    return client


def gemini_usage(u):
    if u is None:
        return None
    return u.model_dump(exclude_none=True, mode="json")


def usage_dict(u):
    if u is None:
        return None
    if hasattr(u, "model_dump"):
        return u.model_dump(exclude_none=True)
    return dict(u)


def run(args):
    s = args.scenario
    msgs = [{"role": "user", "content": args.prompt}]
    model = args.model or ("claude-test" if s.startswith("anthropic") else "gpt-test")
    if s == "openai-chat" or s == "openai-error":
        r = openai_client(args).chat.completions.with_raw_response.create(
            model=model, messages=msgs, max_tokens=args.max_tokens
        )
        c = r.parse()
        return {
            "text": c.choices[0].message.content,
            "finish_reason": c.choices[0].finish_reason,
            "usage": usage_dict(c.usage),
            "model": c.model,
            "headers": dict(r.headers),
        }
    if s in ("openai-chat-stream", "openai-chat-stream-usage"):
        extra = {"stream_options": {"include_usage": True}} if s.endswith("usage") else {}
        if args.tool_properties:
            props = {p: {"type": "string"} for p in args.tool_properties.split(",")}
            extra["tools"] = [
                {
                    "type": "function",
                    "function": {"name": "save", "parameters": {"type": "object", "properties": props}},
                }
            ]
        text, usage, chunks, finish = "", None, 0, None
        stream = openai_client(args).chat.completions.create(
            model=model, messages=msgs, max_tokens=args.max_tokens, stream=True, **extra
        )
        for chunk in stream:
            chunks += 1
            if chunk.usage is not None:
                usage = usage_dict(chunk.usage)
            for ch in chunk.choices:
                text += ch.delta.content or ""
                finish = ch.finish_reason or finish
        return {"text": text, "usage": usage, "chunks": chunks, "finish_reason": finish}
    if s == "openai-completions":
        c = openai_client(args).completions.create(
            model=model, prompt=args.prompt, max_tokens=args.max_tokens
        )
        return {"text": c.choices[0].text, "usage": usage_dict(c.usage)}
    if s == "openai-completions-stream":
        text, usage = "", None
        for chunk in openai_client(args).completions.create(
            model=model,
            prompt=args.prompt,
            max_tokens=args.max_tokens,
            stream=True,
            stream_options={"include_usage": True},
        ):
            if chunk.usage is not None:
                usage = usage_dict(chunk.usage)
            for ch in chunk.choices:
                text += ch.text or ""
        return {"text": text, "usage": usage}
    if s == "openai-embeddings":
        e = openai_client(args).embeddings.create(model=model, input=args.prompt)
        return {"dims": len(e.data[0].embedding), "usage": usage_dict(e.usage)}
    if s == "openai-responses":
        r = openai_client(args).responses.create(
            model=model, input=args.prompt, max_output_tokens=args.max_tokens
        )
        return {"text": r.output_text, "usage": usage_dict(r.usage), "status": r.status}
    if s == "openai-responses-stream":
        text, usage, events = "", None, []
        with openai_client(args).responses.stream(
            model=model, input=args.prompt, max_output_tokens=args.max_tokens
        ) as stream:
            for ev in stream:
                events.append(ev.type)
                if ev.type == "response.output_text.delta":
                    text += ev.delta
            final = stream.get_final_response()
            usage = usage_dict(final.usage)
        return {"text": text, "usage": usage, "events": events, "final_text": final.output_text}
    if s in ("anthropic-messages", "anthropic-error"):
        extra = {}
        if args.thinking_budget is not None:
            extra["thinking"] = {"type": "enabled", "budget_tokens": args.thinking_budget}
        r = anthropic_client(args).messages.with_raw_response.create(
            model=model, max_tokens=args.max_tokens, messages=msgs, **extra
        )
        m = r.parse()
        return {
            "text": "".join(b.text for b in m.content if b.type == "text"),
            "stop_reason": m.stop_reason,
            "usage": usage_dict(m.usage),
            "headers": dict(r.headers),
        }
    if s == "anthropic-messages-stream":
        text, events = "", []
        with anthropic_client(args).messages.stream(
            model=model, max_tokens=args.max_tokens, messages=msgs
        ) as stream:
            for ev in stream:
                events.append(ev.type)
                if ev.type == "text":
                    text += ev.text
            final = stream.get_final_message()
        return {
            "text": text,
            "final_text": "".join(b.text for b in final.content if b.type == "text"),
            "usage": usage_dict(final.usage),
            "stop_reason": final.stop_reason,
            "events": events,
        }
    if s == "openai-responses-background":
        r = openai_client(args).responses.create(
            model=model, input=args.prompt, max_output_tokens=args.max_tokens, background=True
        )
        return {"id": r.id, "status": r.status, "usage": usage_dict(r.usage)}
    if s == "openai-batches-error":
        b = openai_client(args).batches.create(
            input_file_id="file-abc", endpoint="/v1/chat/completions", completion_window="24h"
        )
        return {"id": getattr(b, "id", None)}
    if s == "anthropic-batches-error":
        params = {"model": model, "max_tokens": args.max_tokens, "messages": msgs}
        b = anthropic_client(args).messages.batches.create(requests=[{"custom_id": "a", "params": params}])
        return {"id": getattr(b, "id", None)}
    if s == "anthropic-count-tokens":
        r = anthropic_client(args).messages.with_raw_response.count_tokens(model=model, messages=msgs)
        return {"status": r.status_code}
    if s == "litellm-chat":
        import litellm

        r = litellm.completion(
            model="openai/" + model,
            api_base=args.base_url + "/v1",
            api_key="sk-test",
            messages=msgs,
            max_tokens=args.max_tokens,
            extra_headers=headers_of(args),
            num_retries=0,
        )
        return {"text": r.choices[0].message.content, "usage": usage_dict(r.usage)}
    if s in ("azure-chat", "azure-error", "azure-v1-chat"):
        client = azure_v1_client(args) if s.startswith("azure-v1") else azure_client(args)
        r = client.chat.completions.with_raw_response.create(
            model=args.model or "dep-1", messages=msgs, max_tokens=args.max_tokens
        )
        c = r.parse()
        return {
            "text": c.choices[0].message.content,
            "usage": usage_dict(c.usage),
            "path": str(r.http_request.url.path),
            "headers": dict(r.headers),
        }
    if s in ("azure-chat-stream", "azure-v1-chat-stream"):
        client = azure_v1_client(args) if s.startswith("azure-v1") else azure_client(args)
        extra = {} if args.no_stream_usage else {"stream_options": {"include_usage": True}}
        text, usage, chunks = "", None, 0
        for chunk in client.chat.completions.create(
            model=args.model or "dep-1",
            messages=msgs,
            max_tokens=args.max_tokens,
            stream=True,
            **extra,
        ):
            chunks += 1
            if chunk.usage is not None:
                usage = usage_dict(chunk.usage)
            for ch in chunk.choices:
                text += ch.delta.content or ""
        return {"text": text, "usage": usage, "chunks": chunks}
    if s.startswith("gemini-") or s.startswith("vertex-"):
        from google.genai import types

        client = genai_client(args, vertex=s.startswith("vertex-"))
        model = args.model or "gemini-2.5-flash"
        config = types.GenerateContentConfig(max_output_tokens=args.max_tokens)
        if s.endswith("-count-tokens"):
            r = client.models.count_tokens(model=model, contents=args.prompt)
            return {"total_tokens": r.total_tokens}
        if s.endswith("-stream"):
            text, usage, chunks, finish = "", None, 0, None
            for chunk in client.models.generate_content_stream(
                model=model, contents=args.prompt, config=config
            ):
                chunks += 1
                text += chunk.text or ""
                if chunk.usage_metadata is not None:
                    usage = gemini_usage(chunk.usage_metadata)
                if chunk.candidates and chunk.candidates[0].finish_reason:
                    finish = str(chunk.candidates[0].finish_reason)
            return {"text": text, "usage": usage, "chunks": chunks, "finish_reason": finish}
        r = client.models.generate_content(model=model, contents=args.prompt, config=config)
        return {
            "text": r.text,
            "usage": gemini_usage(r.usage_metadata),
            "finish_reason": str(r.candidates[0].finish_reason) if r.candidates else None,
        }
    if s.startswith("bedrock-"):
        client = bedrock_client(args)
        model = args.model or "anthropic.claude-3-5-haiku-20241022-v1:0"
        messages = [{"role": "user", "content": [{"text": args.prompt}]}]
        inference = {"maxTokens": args.max_tokens}
        if s == "bedrock-converse-stream":
            r = client.converse_stream(modelId=model, messages=messages, inferenceConfig=inference)
            text, usage, stop, events = "", None, None, []
            for ev in r["stream"]:
                name = next(iter(ev))
                events.append(name)
                if name == "contentBlockDelta":
                    text += ev[name]["delta"].get("text", "")
                elif name == "messageStop":
                    stop = ev[name].get("stopReason")
                elif name == "metadata":
                    usage = ev[name].get("usage")
            return {"text": text, "usage": usage, "stop_reason": stop, "events": events}
        r = client.converse(modelId=model, messages=messages, inferenceConfig=inference)
        return {
            "text": "".join(b.get("text", "") for b in r["output"]["message"]["content"]),
            "usage": r.get("usage"),
            "stop_reason": r.get("stopReason"),
            "retries_taken": r["ResponseMetadata"].get("RetryAttempts"),
        }
    raise SystemExit(f"unknown scenario {s}")


def describe(e, started):
    out = {
        "ok": False,
        "exception": type(e).__name__,
        "classes": [c.__name__ for c in type(e).__mro__],
        "message": str(e)[:500],
        "elapsed": time.monotonic() - started,
    }
    for attr in ("status_code", "code", "type", "param", "request_id", "error_code"):
        if hasattr(e, attr):
            v = getattr(e, attr)
            out[attr] = v if isinstance(v, (str, int, float, type(None))) else str(v)
    # google-genai's APIError: code (the HTTP status), status (google.rpc.Code), message.
    if type(e).__module__.startswith("google.genai"):
        out["status_code"] = getattr(e, "code", None)
        out["status"] = getattr(e, "status", None)
        out["message"] = getattr(e, "message", None)
        out["details"] = getattr(e, "details", None)
    # botocore's ClientError: the parsed error and the response metadata.
    if type(e).__module__.startswith("botocore"):
        r = getattr(e, "response", {}) or {}
        meta = r.get("ResponseMetadata", {})
        out["status_code"] = meta.get("HTTPStatusCode")
        out["code"] = r.get("Error", {}).get("Code")
        out["message"] = r.get("Error", {}).get("Message")
        out["request_id"] = meta.get("RequestId")
        out["retries_taken"] = meta.get("RetryAttempts")
        out["headers"] = meta.get("HTTPHeaders")
        return out
    resp = getattr(e, "response", None)
    if resp is not None:
        out["headers"] = dict(resp.headers)
        try:
            out["body"] = resp.json()
        except Exception:  # noqa: BLE001 - a non-JSON body is reported as text
            out["body"] = resp.text
    return out


def one(args):
    # Imported before the clock starts: `elapsed` is the call alone (with its retries).
    if args.scenario.startswith("openai") or args.scenario.startswith("azure"):
        import openai  # noqa: F401
    elif args.scenario.startswith("gemini") or args.scenario.startswith("vertex"):
        # The first client pulls in most of the SDK (types, auth): made once before the clock.
        genai_client(args, vertex=args.scenario.startswith("vertex"))
    elif args.scenario.startswith("bedrock"):
        # The first client loads the service model (then cached by the session's loader).
        bedrock_client(args)
    elif args.scenario.startswith("anthropic"):
        import anthropic  # noqa: F401
    elif args.scenario.startswith("litellm"):
        import litellm  # noqa: F401
    time.sleep(args.sleep_before)
    started = time.monotonic()
    try:
        out = {"ok": True, **run(args)}
        out["elapsed"] = time.monotonic() - started
    except Exception as e:  # noqa: BLE001 - every SDK exception is the result being tested
        out = describe(e, started)
    return out


def main():
    # The SDKs log "Retrying request to … in N seconds" at INFO on their own loggers.
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(name)s: %(message)s")
    if sys.argv[1:] == ["batch"]:
        # A JSON list of argument lists on stdin, one call each (one interpreter start for many calls).
        results = []
        for argv in json.load(sys.stdin):
            sys.argv = [sys.argv[0], *argv]
            results.append(one(parse_args()))
        print(json.dumps(results, default=str))
        return
    if sys.argv[1:] == ["lines"]:
        # One JSON argument list a line, one result line each, as they come: a test starts the
        # interpreter (and an SDK, with a first call) before the moment a call must be timed.
        for line in sys.stdin:
            sys.argv = [sys.argv[0], *json.loads(line)]
            print(json.dumps(one(parse_args()), default=str), flush=True)
        return
    print(json.dumps(one(parse_args()), default=str))


if __name__ == "__main__":
    main()
