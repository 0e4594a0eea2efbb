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
japanese-tech.jsonl  paragraphs of Japanese technical prose (sentences written for this corpus: katakana
                   loanwords, kanji compounds, inline English terms and identifiers, full-width punctuation)
mixed-prose.jsonl  Thai or Japanese paragraphs around English sentences, URLs, inline code and code blocks

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

# Japanese technical prose, written for this corpus: katakana loanwords, kanji compounds, inline English
# terms and identifiers, full-width punctuation. Sentence k serves the split of parity k % 2.
JA_TECH = [
    "本記事では、Kubernetesクラスタ上でEnvoyをサイドカーとして動かし、LLMプロバイダへのリクエストをレート制限する構成を解説します。",
    "まず、`kubectl apply -f envoy.yaml`でデプロイメントを作成し、Podが`Running`状態になったことを確認してください。",
    "トークンバケットは、一定の速度でトークンを補充し、リクエストごとに推定コストを差し引くアルゴリズムです。",
    "バースト容量を超えるリクエストは、HTTPステータス429（Too Many Requests）で即座に拒否されます。",
    "レスポンスヘッダーの`retry-after`には、次にリクエストを送信できるまでの秒数が格納されます。",
    "WebAssembly（Wasm）フィルターはV8エンジン上で実行されるため、ネイティブコードと比べてオーバーヘッドが発生します。",
    "ベンチマークの結果、1キロバイトあたりの処理時間は約2マイクロ秒で、ネットワーク遅延に比べれば無視できる水準でした。",
    "設定ファイルはYAML形式で記述し、`rules`配列の各要素に`tenant`、`model`、`tokens_per_minute`を指定します。",
    "テナントの識別には`x-tenant-id`ヘッダーを使用し、ヘッダーが存在しない場合はAPIキーのSHA-256ハッシュを用います。",
    "Redisへの接続が失敗した場合の挙動は、`failure_mode`パラメータで「open」または「closed」を選択できます。",
    "サーキットブレーカーは、連続したエラーの回数がしきい値を超えると、一定時間すべてのリクエストを遮断します。",
    "この状態を「オープン」と呼び、タイムアウト後は「ハーフオープン」状態に遷移して試験的にリクエストを通します。",
    "PythonのSDKを使う場合、`client.chat.completions.create()`の引数に`max_tokens=256`を渡すと出力の上限を設定できます。",
    "ストリーミング応答では、Server-Sent Events（SSE）形式でチャンクが順次送られてきます。",
    "最後のチャンクに`usage`フィールドが含まれるよう、`stream_options={\"include_usage\": true}`を指定してください。",
    "非同期処理には`asyncio`を使い、複数のリクエストを並行して送信することでスループットを向上させます。",
    "ただし、同時接続数が多すぎるとプロバイダ側のレート制限に引っかかるため、セマフォで並列度を制御しましょう。",
    "ログはJSON Lines形式で標準出力に書き出され、FluentdやVectorなどのログコレクターで収集できます。",
    "メトリクスはPrometheus形式でエクスポートされ、Grafanaのダッシュボードで可視化できます。",
    "`tokengate_requests_total`カウンターは、判定結果（admitted、rejected、error）ごとにラベル付けされています。",
    "マイクロサービスアーキテクチャでは、各サービスが独立してスケールアウトできることが大きなメリットです。",
    "一方で、分散トレーシングやサービスディスカバリなど、運用上の複雑さが増すというデメリットもあります。",
    "データベースのマイグレーションは、`alembic upgrade head`コマンドで最新のリビジョンまで適用します。",
    "本番環境にデプロイする前に、ステージング環境で負荷テストを実施し、レイテンシのp99を計測しました。",
    "キャッシュのヒット率が低い場合は、TTLの設定値やキャッシュキーの設計を見直す必要があります。",
    "TypeScriptの型定義を活用すると、コンパイル時にインターフェースの不整合を検出できます。",
    "Reactコンポーネントの再レンダリングを抑えるには、`useMemo`や`useCallback`フックが有効です。",
    "GitHub Actionsのワークフローで、プルリクエストごとにユニットテストと静的解析を自動実行しています。",
    "Dockerイメージのサイズを削減するため、マルチステージビルドを採用し、ランタイムには`distroless`ベースイメージを使いました。",
    "環境変数`OPENAI_API_KEY`が設定されていないと、クライアントの初期化時に例外が送出されます。",
    "トークナイザーはテキストをサブワード単位に分割し、それぞれに整数のIDを割り当てます。",
    "日本語は単語の区切りに空白を使わないため、英語に比べて1文字あたりのトークン数が多くなる傾向があります。",
    "プロンプトの先頭にシステムメッセージを置き、モデルの役割や出力形式を明示的に指示します。",
    "Function Callingを利用すると、モデルがJSONスキーマに従った引数を生成し、外部ツールを呼び出せます。",
    "埋め込みベクトルはコサイン類似度で比較し、上位k件のドキュメントを検索結果として返します。",
    "ベクトルデータベースには、pgvectorを導入したPostgreSQLを採用しました。",
    "RAG（検索拡張生成）の精度は、チャンクの分割方法とリランキングの有無に大きく左右されます。",
    "認証にはOAuth 2.0のクライアントクレデンシャルフローを用い、アクセストークンの有効期限は1時間です。",
    "TLS証明書の更新はcert-managerが自動で行い、期限切れによる障害を防いでいます。",
    "ロードバランサーのヘルスチェックが失敗すると、該当インスタンスはトラフィックの振り分け対象から外れます。",
    "メモリリークの調査には、ヒーププロファイラーを使ってオブジェクトの割り当て状況を確認しました。",
    "ガベージコレクションの停止時間が長くなると、リクエストのタイムアウトが頻発します。",
    "Rustの所有権システムにより、データ競合をコンパイル時に防ぐことができます。",
    "`Result`型と`?`演算子を組み合わせると、エラー処理を簡潔に記述できます。",
    "このライブラリはno_std環境にも対応しており、組み込み機器やWasmターゲットでも利用可能です。",
    "Goのgoroutineは軽量スレッドであり、数万個を同時に起動してもメモリ消費は数百メガバイト程度に収まります。",
    "チャネルを介したメッセージパッシングにより、共有メモリを直接操作せずに並行処理を実装できます。",
    "APIのバージョニングは、URLパスに`/v1/`を含める方式を採用しています。",
    "後方互換性のない変更を加える際は、新しいメジャーバージョンとして`/v2/`エンドポイントを用意します。",
    "レスポンスのページネーションには、オフセット方式ではなくカーソル方式を推奨します。",
    "ユーザーがボタンをクリックすると、フロントエンドからバックエンドのREST APIにPOSTリクエストが送られます。",
    "入力値のバリデーションはサーバーサイドでも必ず行い、SQLインジェクションやXSSを防止してください。",
    "シークレット情報はGitリポジトリにコミットせず、Vaultなどのシークレットマネージャーで管理します。",
    "インシデント発生時は、まずアラートの内容を確認し、影響範囲を特定してからエスカレーションします。",
    "ポストモーテムでは、根本原因と再発防止策をドキュメントにまとめ、チーム全体で共有しました。",
    "SLOとして可用性99.9%を掲げ、エラーバジェットを使い切った場合は新機能のリリースを凍結します。",
    "オブザーバビリティの三本柱は、ログ、メトリクス、トレースです。",
    "OpenTelemetryのSDKを組み込むことで、ベンダーに依存しない形でテレメトリデータを収集できます。",
    "コンテナオーケストレーションの分野では、Kubernetesが事実上の標準となっています。",
    "Helmチャートを使えば、複数のマニフェストをテンプレート化し、環境ごとに値を切り替えられます。",
    "Istioのサービスメッシュでは、`EnvoyFilter`リソースを使ってWasmプラグインを注入します。",
    "プラグインの設定はJSON文字列として渡され、起動時にバリデーションが実行されます。",
    "設定に誤りがある場合、フィルターはエラーログを1行出力し、設定の適用を拒否します。",
    "共有データ（shared data）はワーカースレッド間で値を共有するための仕組みで、CAS操作による楽観的排他制御をサポートします。",
    "月間クォータはRedisに保存され、リクエストの開始時に予約し、レスポンスの完了時に実際の使用量で精算します。",
    "推定値が実際のトークン数より少ないと、クォータを超過したリクエストが通過してしまう恐れがあります。",
    "そのため推定器は、実測値をやや上回るように係数を調整しています。",
    "ファインチューニングしたモデルは、ベースモデルと同じトークナイザーを使用します。",
    "温度パラメータ`temperature`を0に近づけるほど、出力は決定的になります。",
    "コンテキストウィンドウの上限を超えると、APIは`context_length_exceeded`エラーを返します。",
    "長い会話履歴は要約して圧縮するか、古いメッセージから順に削除する必要があります。",
    "バッチAPIを利用すると、24時間以内に処理が完了する代わりに料金が50%割引されます。",
    "画像入力は解像度に応じてタイルに分割され、タイル数に比例してトークンが課金されます。",
    "音声認識には`whisper-1`モデルを使用し、音声ファイルはmp3またはwav形式でアップロードします。",
    "このエラーは、リクエストボディのJSONが不正な場合に発生します。カンマの付け忘れや、閉じ括弧の不足がないか確認してください。",
    "Node.jsでは`fetch`がグローバルに利用できるようになったため、`axios`などの外部ライブラリは必須ではありません。",
    "パッケージマネージャーにはpnpmを使い、モノレポ内の依存関係をワークスペース機能で管理しています。",
    "ビルドが遅い原因を調べたところ、型チェックに全体の7割の時間がかかっていることが分かりました。",
    "`tsconfig.json`で`incremental`オプションを有効にすると、2回目以降のビルドが高速化されます。",
    "Linuxカーネルのcgroupsを利用して、コンテナごとにCPUとメモリの使用量を制限しています。",
    "OOMキラーによってプロセスが強制終了された場合、`dmesg`コマンドでカーネルログを確認できます。",
    "ファイルディスクリプタの上限に達すると、新しいソケットを開けなくなり「Too many open files」エラーが発生します。",
    "`ulimit -n 65536`で上限を引き上げるか、systemdのユニットファイルで`LimitNOFILE`を設定してください。",
    "TCPのKeep-Aliveを有効にすると、アイドル状態のコネクションが途中で切断されるのを防げます。",
    "HTTP/2では1本のコネクション上で複数のストリームを多重化でき、ヘッドオブラインブロッキングが緩和されます。",
    "gRPCはProtocol Buffersでメッセージをシリアライズし、HTTP/2上で双方向ストリーミングを実現します。",
    "スキーマの変更時は、フィールド番号を再利用しないよう注意が必要です。",
    "機械学習パイプラインでは、前処理、学習、評価、デプロイの各ステップを自動化しています。",
    "学習データの品質がモデルの性能を大きく左右するため、アノテーションのガイドラインを整備しました。",
    "評価指標には正解率（accuracy）だけでなく、F1スコアやAUCも併せて確認します。",
    "過学習を防ぐために、ドロップアウトと早期終了（early stopping）を導入しました。",
    "GPUのメモリが不足する場合は、バッチサイズを小さくするか、勾配累積を利用してください。",
    "混合精度学習（mixed precision）を使うと、学習速度が向上し、メモリ使用量も削減できます。",
    "推論サーバーにはvLLMを採用し、PagedAttentionによってKVキャッシュのメモリ効率を高めています。",
    "量子化によってモデルのサイズを4分の1に縮小しつつ、精度の低下は1ポイント未満に抑えられました。",
    "社内向けチャットボットは、Slackのスラッシュコマンド`/ask`から呼び出せるようにしました。",
    "ユーザーからのフィードバックは、👍と👎のリアクションで収集し、週次でレビューしています。",
    "セキュリティ監査の結果、いくつかの依存パッケージに既知の脆弱性（CVE）が見つかりました。",
    "`npm audit fix`を実行して修正版に更新し、回帰テストがすべて通ることを確認しました。",
    "ブランチ戦略はトランクベース開発を採用し、フィーチャーフラグで未完成の機能を隠しています。",
    "コードレビューでは、可読性、テストの有無、パフォーマンスへの影響の3点を重点的に確認します。",
    "リファクタリングの際は、まず既存の挙動をテストで固定してから、内部構造を変更しましょう。",
    "正規表現`^[a-z0-9_-]{3,16}$`でユーザー名の形式をチェックしています。",
    "タイムゾーンの扱いには注意が必要で、サーバー内部ではすべてUTC、表示時のみJST（UTC+9）に変換します。",
    "日付の文字列表現には、ISO 8601形式（例：2025-04-01T09:00:00+09:00）を使用してください。",
    "文字コードはUTF-8に統一し、BOM付きのファイルはCIで検出してエラーにしています。",
    "全角英数字と半角英数字が混在していると、検索でヒットしない原因になります。",
    "NFKC正規化を適用すれば、全角の「ＡＢＣ１２３」は半角の「ABC123」に変換されます。",
    "CSVファイルをExcelで開くと文字化けする場合は、Shift_JISではなくBOM付きUTF-8で出力してください。",
    "オンプレミス環境からクラウドへの移行では、まずステートレスなWebサーバーから着手しました。",
    "AWSのLambdaはコールドスタートの遅延が課題で、プロビジョンド同時実行で対処しています。",
    "S3バケットのパブリックアクセスはデフォルトでブロックし、署名付きURLで一時的に共有します。",
    "Terraformでインフラをコード化し、`terraform plan`の差分をプルリクエスト上でレビューしています。",
    "ステートファイルはリモートバックエンドに保存し、DynamoDBでロックを取得して同時実行を防ぎます。",
    "監視アラートが多すぎると、本当に重要な通知が埋もれてしまう「アラート疲れ」が起こります。",
    "オンコール担当者の負担を減らすため、自動復旧できる障害はRunbookに沿ってスクリプト化しました。",
    "Envoyの管理インターフェース（`:9901/stats`）から、フィルターごとのカウンターを確認できます。",
    "`wasm.tokengate.rejected`の値が急増している場合は、バケットの容量設定が小さすぎる可能性があります。",
    "この関数は引数`timeout_ms`が0以下の場合に`InvalidArgument`エラーを返します。",
    "ワーカープロセスの数はCPUコア数と同じにするのが一般的ですが、I/Oバウンドな処理ではそれより多くしても構いません。",
    "検証の結果、レスポンスタイムの中央値は120ミリ秒、p95は480ミリ秒でした。",
    "アップデート後にログイン画面が表示されない不具合は、キャッシュされた古いJavaScriptファイルが原因でした。",
    "ハッシュ値をファイル名に含める（例：`app.3f9a2c.js`）ことで、キャッシュの無効化を確実に行えます。",
]

# Thai technical sentences, written for this corpus (parity as JA_TECH).
TH_TECH = [
    "บทความนี้อธิบายวิธีตั้งค่า Envoy ให้จำกัดอัตราการเรียกใช้ API ของโมเดลภาษาขนาดใหญ่",
    "ก่อนเริ่มต้น ให้ติดตั้ง Docker และตรวจสอบว่าเครื่องของคุณเชื่อมต่ออินเทอร์เน็ตได้",
    "ระบบจะประมาณจำนวนโทเค็นจากเนื้อหาของคำขอ แล้วหักออกจากถังโทเค็นของผู้ใช้แต่ละราย",
    "หากโทเค็นในถังไม่เพียงพอ คำขอจะถูกปฏิเสธด้วยรหัสสถานะ 429 ทันที",
    "ค่าในส่วนหัว retry-after บอกจำนวนวินาทีที่ต้องรอก่อนส่งคำขอใหม่",
    "ไฟล์การตั้งค่าเขียนในรูปแบบ YAML และต้องระบุชื่อโมเดลกับจำนวนโทเค็นต่อนาที",
    "เราใช้ Redis เก็บโควตารายเดือนของลูกค้าแต่ละราย และอัปเดตทุกครั้งที่การตอบกลับเสร็จสิ้น",
    "ถ้าการเชื่อมต่อกับ Redis ล้มเหลว ระบบจะทำงานตามโหมดที่กำหนดไว้ในการตั้งค่า",
    "การทดสอบประสิทธิภาพพบว่าตัวกรองใช้เวลาประมวลผลไม่ถึงสองไมโครวินาทีต่อหนึ่งกิโลไบต์",
    "ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ ทำให้ตัวตัดคำต้องอาศัยพจนานุกรมในการแบ่งคำ",
    "โมเดลจะคิดค่าบริการตามจำนวนโทเค็นทั้งขาเข้าและขาออก",
    "ผู้ดูแลระบบสามารถดูสถิติการใช้งานได้จากแดชบอร์ดของ Grafana",
    "เมื่อเกิดข้อผิดพลาดต่อเนื่องหลายครั้ง เบรกเกอร์จะเปิดและหยุดส่งคำขอไปยังผู้ให้บริการชั่วคราว",
    "หลังจากหมดเวลาที่กำหนด ระบบจะลองส่งคำขอทดสอบอีกครั้งเพื่อดูว่าบริการกลับมาปกติหรือยัง",
    "ควรเก็บคีย์ API ไว้ในตัวแปรสภาพแวดล้อม และห้ามบันทึกลงในที่เก็บโค้ดเด็ดขาด",
    "การอัปเกรดเวอร์ชันใหม่ต้องทดสอบบนสภาพแวดล้อมจำลองก่อนนำขึ้นระบบจริงเสมอ",
    "ทีมของเราใช้ Kubernetes ในการจัดการคอนเทนเนอร์ทั้งหมดบนคลาวด์",
    "บันทึกการทำงานทุกบรรทัดอยู่ในรูปแบบ JSON เพื่อให้ค้นหาและวิเคราะห์ได้ง่าย",
    "หากต้องการรับผลลัพธ์แบบสตรีม ให้ตั้งค่าพารามิเตอร์ stream เป็น true",
    "ข้อความระบบช่วยกำหนดบทบาทและรูปแบบคำตอบที่ต้องการจากโมเดล",
    "การแบ่งเอกสารเป็นส่วนย่อยที่เหมาะสมช่วยให้การค้นหาแบบเวกเตอร์แม่นยำขึ้น",
    "ใบรับรอง TLS จะต่ออายุโดยอัตโนมัติก่อนหมดอายุสามสิบวัน",
    "ผลการทดสอบโหลดแสดงว่าเวลาตอบสนองเฉลี่ยอยู่ที่ประมาณหนึ่งร้อยมิลลิวินาที",
    "ถ้าหน่วยความจำไม่พอ ให้ลดขนาดแบตช์หรือเพิ่มจำนวนเครื่องในคลัสเตอร์",
    "เราแนะนำให้เปิดใช้การยืนยันตัวตนแบบสองขั้นตอนสำหรับบัญชีผู้ดูแลทุกคน",
    "สคริปต์นี้จะสำรองฐานข้อมูลทุกคืนและเก็บไฟล์ไว้เจ็ดวัน",
    "การเปลี่ยนแปลงโครงสร้างตารางต้องทำผ่านไฟล์ไมเกรชันเท่านั้น",
    "หากพบปัญหา กรุณาแนบบันทึกข้อผิดพลาดและขั้นตอนการทำซ้ำมาด้วย",
    "ค่าความหน่วงของเครือข่ายระหว่างศูนย์ข้อมูลสองแห่งอยู่ที่ประมาณสามสิบมิลลิวินาที",
    "ระบบแคชช่วยลดภาระของฐานข้อมูลได้มากกว่าครึ่งในช่วงเวลาที่มีผู้ใช้สูงสุด",
]

# English technical sentences, written for this corpus (parity as JA_TECH).
EN_TECH = [
    "The filter runs inside Envoy as a WebAssembly module and charges each request before it reaches the provider.",
    "Set `max_tokens` explicitly; otherwise the per-model default is reserved and settled when the response ends.",
    "If Redis is unreachable, the configured failure mode decides whether requests pass or are refused.",
    "Run `cargo build --release --target wasm32-wasip1` and copy the resulting `.wasm` file into the image.",
    "The bucket refills continuously, so a client that waits for the `retry-after` interval will succeed.",
    "We measured about two microseconds per kilobyte of request body, which is negligible next to network latency.",
    "Each tenant is identified by the `x-tenant-id` header or, failing that, by a hash of its API key.",
    "Streaming responses carry usage only in the final chunk when `include_usage` is set.",
    "See the troubleshooting guide if the dashboard shows a sudden rise in rejected requests.",
    "The tokenizer splits text into pieces before merging bytes, so spaces and punctuation change the count.",
    "Quotas are reserved at the start of a request and settled against the provider's reported usage.",
    "A circuit breaker opens after five consecutive upstream errors and half-opens after thirty seconds.",
    "Use `kubectl logs -l app=envoy --tail=100` to see the last lines of every sidecar.",
    "Configuration errors are logged on one line that names the offending field.",
    "Metrics are exported in Prometheus format under the `tokengate_` prefix.",
    "Before upgrading, run the integration tests against a staging cluster with production-like traffic.",
    "The estimator never counts less than the real tokens on purpose, since a low estimate would let requests slip past the limit.",
    "Large embeddings requests are costed by their input only; no output is reserved.",
    "When the provider returns a 5xx, the bucket charge is kept but the quota reservation is released.",
    "Prefer cursor-based pagination for endpoints that list many objects.",
    "Secrets belong in a secret manager, not in environment files committed to Git.",
    "The load test sent 10,000 requests at 200 per second and recorded a p99 latency of 38 ms.",
    "Check that the model name in the request matches one of the configured rules exactly.",
    "The admin endpoint on port 9901 exposes counters for every filter.",
    "Japanese and Thai text use more tokens per character than English, which the estimator accounts for.",
]

def of_parity(xs, parity):
    return [x for k, x in enumerate(xs) if k % 2 == parity]

def gen_japanese_tech():
    # A paragraph of one to five sentences of JA_TECH of the line's parity, as an article's paragraph is
    # sent (one chat message); now and then a second paragraph after a blank line.
    out = []
    for i in range(N):
        rng = random.Random(6000 + i)
        ss = of_parity(JA_TECH, i % 2)
        para = ''.join(rng.sample(ss, rng.randrange(1, 6)))
        if rng.random() < 0.25:
            para += '\n\n' + ''.join(rng.sample(ss, rng.randrange(1, 3)))
        out.append(para)
    return out

def gen_mixed_prose():
    # Thai or Japanese paragraphs around English sentences, URLs and code: a technical article that
    # quotes English, links and commands. Japanese from JA_TECH and japanese.jsonl, Thai from TH_TECH
    # and thai.jsonl, English from EN_TECH and english.jsonl, code from code.jsonl: all of the line's
    # parity.
    out = []
    for i in range(N):
        rng = random.Random(7000 + i)
        p = i % 2
        ja = (i // 2) % 2 == 0
        if ja:
            own = of_parity(JA_TECH, p) * 2 + sentences('japanese', p)
        else:
            own = of_parity(TH_TECH, p) * 2 + [s for s in sentences('thai', p)]
            if len(own) < 4:
                own += [l for l in lines_of('thai', p) if len(l) < 300]
        en = of_parity(EN_TECH, p) * 2 + sentences('english', p)
        parts = []
        for _ in range(rng.randrange(3, 8)):
            k = rng.randrange(10)
            if k <= 3:
                parts.append(rng.choice(own))
            elif k <= 5:
                parts.append(rng.choice(en))
            elif k == 6:
                parts.append(url(rng))
            elif k == 7:
                parts.append(f"`{rng.choice(['max_tokens', 'kubectl get pods -n prod', 'npm run build', 'SELECT * FROM users LIMIT 10;', 'retry-after', 'cargo test --release', 'git rebase -i HEAD~3', 'x-tenant-id', 'response.usage.total_tokens', 'docker compose up -d'])}`")
            elif k == 8:
                snippet = rng.choice(lines_of('code', p)).split('\n')
                s0 = rng.randrange(len(snippet))
                parts.append('\n```\n' + '\n'.join(snippet[s0:s0 + rng.randrange(2, 7)]) + '\n```\n')
            else:
                o, c = rng.choice([('（', '）'), (' (', ')'), ('：', ''), (': ', '')])
                parts.append(rng.choice(own) + o + rng.choice(en).rstrip('.') + c)
        sep = '' if ja and rng.random() < 0.5 else ' '
        text = sep.join(parts)
        out.append(text.strip())
    return out

write('short', gen_short())
write('tables', gen_tables())
write('urls', gen_urls())
write('identifiers', gen_identifiers())
write('mixed-web', gen_mixed_web())
write('japanese-tech', gen_japanese_tech())
write('mixed-prose', gen_mixed_prose())
