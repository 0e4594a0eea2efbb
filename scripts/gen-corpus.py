#!/usr/bin/env python3
"""Writes the generated classes of corpus/ (deterministic; rerun after editing this file).

  python3 scripts/gen-corpus.py

short.jsonl        72 short chat messages (<= 30 o200k tokens): 36 written by hand in 20 languages, 36
                   sentences of the hand-written classes
tables.jsonl       tab-separated, comma-separated and Markdown tables of words (every script) and numbers
urls.jsonl         prose in several scripts with URLs, file paths, query strings and e-mail addresses
identifiers.jsonl  identifiers as prompts carry them: UUIDs, hex digests, base64/base64url tokens,
                   API-key-like strings, request ids, snake/camel/kebab-case names, random letters
mixed-web.jsonl    Thai, Japanese, Chinese, Korean, Cyrillic, Hindi text mixed with English, URLs, inline
                   code, code blocks, table rows and half-width katakana

Sample i of a generated class takes its words and sentences only from lines of the same parity in the
hand-written classes (even from even, odd from odd), so the held-out split (odd lines) stays unseen by a
fit on the even lines. Truth is o200k_base, counted at test/bench time (benches/common/corpus.rs).
"""
import json, os, random, re

# Lines per generated class (as many as each hand-written class has).
N = 72

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'corpus')

def load(name):
    with open(os.path.join(ROOT, name + '.jsonl'), encoding='utf-8') as f:
        return [json.loads(l)['text'] for l in f if l.strip()]

def write(name, texts):
    assert len(texts) == N, (name, len(texts))
    with open(os.path.join(ROOT, name + '.jsonl'), 'w', encoding='utf-8') as f:
        for t in texts:
            f.write(json.dumps({'text': t}, ensure_ascii=False) + '\n')

SCRIPTS = ['english', 'latin', 'vietnamese', 'cyrillic', 'greek', 'arabic', 'hebrew', 'hindi',
           'thai', 'japanese', 'chinese', 'korean']
SRC = {n: load(n) for n in SCRIPTS + ['code']}

def lines_of(name, parity):
    return [t for i, t in enumerate(SRC[name]) if i % 2 == parity]

def sentences(name, parity):
    out = []
    for t in lines_of(name, parity):
        for s in re.split(r'(?<=[.!?。？！])\s*|\n+', t):
            s = s.strip()
            if 8 <= len(s) <= 160:
                out.append(s)
    return out

def words(name, parity):
    ws = []
    for t in lines_of(name, parity):
        if name in ('thai', 'japanese', 'chinese'):
            # No spaces between words: take short pieces.
            for piece in re.split(r'[\s、。，,.（）()「」]+', t):
                for k in range(0, len(piece) - 1, 3):
                    ws.append(piece[k:k + 2 + (k % 3)])
        else:
            ws += [w.strip('.,;:!?()"«»') for w in t.split()]
    return [w for w in ws if w and not w.isspace()]

SHORT = [
    "hi", "Thanks!", "ok", "Can you make it shorter?", "Translate to French: good morning",
    "fix the typo in line 42", "What does HTTP 429 mean?", "retry with temperature=0.2",
    "Explain `git rebase -i` in one sentence.", "Summarize this in 3 bullet points.",
    "Is 2^61-1 prime?", "yes, go ahead", "Why is my Docker build so slow?",
    "Bonjour, pouvez-vous m'aider ?", "¿Cuál es la capital de Australia?", "Danke, das reicht.",
    "Czy możesz to przetłumaczyć?", "Cảm ơn bạn nhiều!", "Привет! Как дела?",
    "Сделай короче, пожалуйста.", "Привіт, що нового?", "Τι ώρα είναι;", "مرحبا، كيف حالك؟",
    "شكراً جزيلاً", "שלום, מה שלומך?", "नमस्ते, आप कैसे हैं?", "इसे हिंदी में समझाइए।",
    "สวัสดีครับ", "ช่วยแปลเป็นภาษาอังกฤษหน่อย", "ราคาเท่าไหร่คะ", "こんにちは！", "これは何ですか？",
    "もう少し短くしてください。", "你好", "请用中文回答。", "这个报错是什么意思？", "안녕하세요!",
    "좀 더 짧게 써 주세요.", "감사합니다 😊", "👍", "ok 👌 thanks!!", "SELECT count(*) FROM users;",
    "npm ERR! code ERESOLVE", "see https://example.com/docs", "path: /etc/nginx/nginx.conf",
    "pip install -U tiktoken", "Run it on port 8080?", "ETA?",
    "Can you check my grammar?", "Merci beaucoup !", "¿Puedes repetirlo más despacio?", "Wie spät ist es?",
    "Спасибо, понятно.", "Mulțumesc!", "Ευχαριστώ πολύ!", "धन्यवाद!", "ขอบคุณครับ", "ありがとう！",
    "谢谢！", "고마워요", "git status shows nothing?", "cargo build --release fails", "Why 502?",
    "Make it a table.", "curl -I https://example.org", "What's 15% of 240?", "Tôi không hiểu.",
    "תודה!", "لا أفهم", "Dzięki!", "Obrigado!", "TL;DR please",
]

def gen_short():
    # Every other pair of lines hand-written, the rest a sentence (15 to 30 tokens) of a hand-written
    # class of the same parity.
    out = []
    hand = iter(SHORT)
    for i in range(N):
        if i % 4 < 2:
            out.append(next(hand))
            continue
        rng = random.Random(5000 + i)
        script = SCRIPTS[(i // 4) % len(SCRIPTS)]
        dense = script in ('thai', 'japanese', 'chinese', 'korean', 'hindi')
        lo, hi = (12, 40) if dense else (40, 130)
        ss = [s for s in sentences(script, i % 2) if lo <= len(s) <= hi]
        if not ss:
            # No sentence that short (Thai has no full stops): a line cut at a space.
            line = rng.choice(lines_of(script, i % 2))
            cut = line.rfind(' ', 0, hi)
            ss = [line[:cut if cut >= lo else hi]]
        out.append(rng.choice(ss))
    return out

def num(rng):
    k = rng.randrange(6)
    if k == 0:
        return str(rng.randrange(10))
    if k == 1:
        return str(rng.randrange(100, 100000))
    if k == 2:
        return f"{rng.uniform(0, 1000):.2f}"
    if k == 3:
        return f"{rng.randrange(1, 100)}%"
    if k == 4:
        return f"2024-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}"
    return str(-rng.randrange(1, 500))

def gen_tables():
    out = []
    for i in range(N):
        rng = random.Random(1000 + i)
        p = i % 2
        script = SCRIPTS[(i // 2) % len(SCRIPTS)]
        ws = words(script, p) + words('english', p)
        cols = rng.randrange(2, 7)
        rows = rng.randrange(3, 12)
        style = i % 4  # 0, 1: TSV; 2: CSV; 3: Markdown
        head = [rng.choice(ws) for _ in range(cols)]
        body = []
        for _ in range(rows):
            body.append([rng.choice(ws) if rng.random() < 0.5 else num(rng) for _ in range(cols)])
        if style in (0, 1):
            sep = '\t'
            lines = [sep.join(head)] + [sep.join(r) for r in body]
            if style == 1:
                # Empty cells and trailing tabs, as spreadsheets paste them.
                lines = [l + '\t' * rng.randrange(0, 3) for l in lines]
                lines = [l.replace('\t', '\t\t', 1) if rng.random() < 0.3 else l for l in lines]
        elif style == 2:
            lines = [','.join(head)] + [','.join(r) for r in body]
        else:
            lines = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * cols]
            lines += ['| ' + ' | '.join(r) + ' |' for r in body]
        out.append('\n'.join(lines))
    return out

TLDS = ['com', 'org', 'io', 'dev', 'net', 'co.jp', 'de', 'ru', 'in.th', 'cn']
EXT = ['html', 'json', 'py', 'rs', 'yaml', 'pdf', 'png', 'md', 'tar.gz', 'log']

def ascii_words(rng):
    base = ['api', 'docs', 'v1', 'v2', 'users', 'search', 'static', 'assets', 'blog', 'release',
            'download', 'config', 'settings', 'index', 'reports', 'images', 'auth', 'login', 'news',
            'github', 'project', 'issues', 'pull', 'wiki', 'guide', 'install', 'token', 'rate-limit',
            'envoy', 'proxy', 'wasm', 'tenant', 'billing', 'status', 'metrics', 'main', 'src', 'lib']
    return base

def url(rng):
    base = ascii_words(rng)
    host = rng.choice(['www.', '', 'api.', 'docs.', 'cdn.']) + rng.choice(base) + rng.choice(['', '-', '']) + \
        rng.choice(base) + '.' + rng.choice(TLDS)
    path = '/'.join(rng.choice(base) for _ in range(rng.randrange(0, 5)))
    u = rng.choice(['https://', 'http://', 'https://']) + host + ('/' + path if path else '')
    if rng.random() < 0.3:
        u += '/' + ''.join(rng.choice('abcdefghijklmnopqrstuvwxyz0123456789') for _ in range(rng.randrange(6, 14)))
    if rng.random() < 0.3:
        u += '.' + rng.choice(EXT)
    if rng.random() < 0.4:
        u += '?' + '&'.join(f"{rng.choice(base)}={rng.choice([num(rng), rng.choice(base)])}"
                            for _ in range(rng.randrange(1, 4)))
    if rng.random() < 0.1:
        u += '#' + rng.choice(base)
    return u

def path(rng):
    base = ascii_words(rng)
    if rng.random() < 0.7:
        p = rng.choice(['/', '~/', './', '../', '/var/', '/etc/', '/home/user/', '/usr/local/']) + \
            '/'.join(rng.choice(base) for _ in range(rng.randrange(1, 4)))
    else:
        p = rng.choice(['C:\\Users\\admin\\', 'D:\\work\\']) + '\\'.join(rng.choice(base) for _ in range(rng.randrange(1, 3)))
    return p + '.' + rng.choice(EXT)

def gen_urls():
    out = []
    for i in range(N):
        rng = random.Random(2000 + i)
        p = i % 2
        script = SCRIPTS[(i // 2) % len(SCRIPTS)]
        ss = sentences(script, p)
        parts = []
        for _ in range(rng.randrange(2, 5)):
            parts.append(rng.choice(ss))
            k = rng.randrange(4)
            if k == 0:
                parts.append(url(rng))
            elif k == 1:
                parts.append(path(rng))
            elif k == 2:
                parts.append(f"({url(rng)})")
            else:
                user = rng.choice(ascii_words(rng)).replace('-', '.')
                parts.append(f"{user}@{rng.choice(ascii_words(rng))}.{rng.choice(TLDS)}")
        out.append(' '.join(parts))
    return out

HEX = '0123456789abcdef'
B64 = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789'

def ident(rng, ws):
    k = rng.randrange(10)
    if k == 0:
        h = ''.join(rng.choice(HEX) for _ in range(32))
        return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
    if k == 1:
        return ''.join(rng.choice(HEX) for _ in range(rng.choice([7, 12, 40, 64])))
    if k == 2:
        return ''.join(rng.choice(B64 + '+/') for _ in range(rng.randrange(16, 60))) + rng.choice(['', '=', '=='])
    if k == 3:
        return rng.choice(['sk-', 'sk-proj-', 'pk_live_', 'ghp_', 'xoxb-', 'AKIA']) + \
            ''.join(rng.choice(B64) for _ in range(rng.randrange(20, 40)))
    if k == 4:
        return rng.choice(['req_', 'chatcmpl-', 'msg_', 'run_', 'call_']) + ''.join(rng.choice(B64) for _ in range(24))
    if k == 5:
        return '_'.join(rng.choice(ws).lower() for _ in range(rng.randrange(2, 5)))
    if k == 6:
        w = [rng.choice(ws) for _ in range(rng.randrange(2, 5))]
        return w[0].lower() + ''.join(x[:1].upper() + x[1:].lower() for x in w[1:])
    if k == 7:
        return '-'.join(rng.choice(ws).lower() for _ in range(rng.randrange(2, 4))) + '-' + \
            ''.join(rng.choice('abcdefghijklmnopqrstuvwxyz0123456789') for _ in range(5))
    if k == 8:
        return ''.join(rng.choice('abcdefghijklmnopqrstuvwxyz') for _ in range(rng.randrange(5, 16)))
    return ''.join(rng.choice('ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789') for _ in range(rng.randrange(6, 14)))

def gen_identifiers():
    out = []
    for i in range(N):
        rng = random.Random(3000 + i)
        ws = [w for w in words('english', i % 2) if w.isascii() and w.isalpha() and len(w) > 2]
        items = []
        for _ in range(rng.randrange(3, 10)):
            style = rng.randrange(4)
            v = ident(rng, ws)
            if style == 0:
                items.append(v)
            elif style == 1:
                items.append(f"{rng.choice(['id', 'key', 'trace_id', 'sha', 'token', 'name'])}={v}")
            elif style == 2:
                items.append(f'"{rng.choice(["id", "request_id", "commit", "user"])}": "{v}"')
            else:
                items.append(f"`{v}`")
        sep = rng.choice([' ', ', ', '\n', '; '])
        out.append(sep.join(items))
    return out

HALFWIDTH = ['ｶﾀｶﾅ', 'ﾃｽﾄ', 'ﾒｰﾙ', 'ｻｰﾊﾞｰ', 'ﾊﾟｽﾜｰﾄﾞ', 'ﾛｸﾞｲﾝ', 'ｴﾗｰ', 'ﾀﾞｳﾝﾛｰﾄﾞ', 'ｺﾝﾋﾟｭｰﾀ', 'ﾌｧｲﾙ']

def gen_mixed_web():
    out = []
    asian = ['thai', 'japanese', 'chinese', 'korean', 'cyrillic', 'hindi']
    code = SRC['code']
    for i in range(N):
        rng = random.Random(4000 + i)
        p = i % 2
        script = asian[(i // 2) % len(asian)]
        ss = sentences(script, p)
        en = sentences('english', p)
        parts = []
        for _ in range(rng.randrange(3, 7)):
            k = rng.randrange(8)
            if k <= 1:
                parts.append(rng.choice(ss))
            elif k == 2:
                parts.append(rng.choice(en))
            elif k == 3:
                parts.append(url(rng))
            elif k == 4:
                c = lines_of('code', p)
                snippet = rng.choice(c).split('\n')
                s0 = rng.randrange(len(snippet))
                parts.append('```\n' + '\n'.join(snippet[s0:s0 + rng.randrange(2, 6)]) + '\n```')
            elif k == 5:
                ws = words(script, p)
                parts.append('\n' + '\n'.join('\t'.join([rng.choice(ws), num(rng), num(rng)]) for _ in range(rng.randrange(2, 5))) + '\n')
            elif k == 6:
                parts.append(f"`{rng.choice(['max_tokens', 'response.json()', 'kubectl get pods', 'tokens_per_second', 'x-tenant-id'])}`")
            else:
                if script == 'japanese' or rng.random() < 0.3:
                    parts.append(''.join(rng.choice(HALFWIDTH) for _ in range(rng.randrange(1, 4))))
                else:
                    parts.append(rng.choice(ss))
        out.append(' '.join(parts))
    return out

write('short', gen_short())
write('tables', gen_tables())
write('urls', gen_urls())
write('identifiers', gen_identifiers())
write('mixed-web', gen_mixed_web())
