// Records exactly what the OpenAI and Anthropic Node SDKs send (path, headers, body).
import http from 'node:http';
import fs from 'node:fs';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';

const out = process.argv[2];
fs.mkdirSync(out, { recursive: true });
const server = http.createServer((req, res) => {
  const chunks = [];
  req.on('data', (c) => chunks.push(c));
  req.on('end', () => {
    const body = Buffer.concat(chunks);
    const name = req.headers['x-capture'];
    fs.writeFileSync(`${out}/${name}.json`, body);
    fs.writeFileSync(`${out}/${name}.meta`, JSON.stringify({ method: req.method, url: req.url, headers: req.headers }, null, 1));
    res.setHeader('content-type', 'application/json');
    res.end('{}');
  });
});
await new Promise((r) => server.listen(0, '127.0.0.1', r));
const base = `http://127.0.0.1:${server.address().port}`;
const openai = new OpenAI({ apiKey: 'sk-test', baseURL: `${base}/v1`, maxRetries: 0 });
const anthropic = new Anthropic({ apiKey: 'sk-ant-test', baseURL: base, maxRetries: 0 });
const h = (name) => ({ headers: { 'x-capture': name } });

// A 1×1 PNG, and a 2×2 one: two different images.
const png1 = 'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==';
const png2 = 'iVBORw0KGgoAAAANSUhEUgAAAAIAAAACCAYAAABytg0kAAAAFklEQVR42mNk+M9QzwAEjDAGNzYAAIxbBBGYnVOmAAAAAElFTkSuQmCC';

const weatherFn = {
  name: 'get_weather',
  description: 'Get the current weather in a city',
  parameters: { type: 'object', properties: { city: { type: 'string', description: 'City name' }, unit: { type: 'string', enum: ['c', 'f'] } }, required: ['city'] },
};

const turn1 = [
  { role: 'user', content: [ { type: 'input_text', text: 'What is in this picture, and what is the weather in Paris?' }, { type: 'input_image', image_url: `data:image/png;base64,${png1}`, detail: 'auto' } ] },
];
const rtools = [{ type: 'function', ...weatherFn, strict: false }];
await openai.responses.create({ model: 'gpt-4.1-mini', instructions: 'You are a helpful assistant.', tools: rtools, input: turn1, max_output_tokens: 256, store: false }, h('responses-turn1'));
const turn2 = [...turn1,
  { type: 'reasoning', id: 'rs_1', summary: [{ type: 'summary_text', text: 'The user wants the weather; call the tool.' }] },
  { type: 'function_call', id: 'fc_1', call_id: 'call_1', name: 'get_weather', arguments: '{"city":"Paris"}', status: 'completed' },
  { type: 'function_call_output', call_id: 'call_1', output: '{"temp_c":18,"sky":"clear"}' },
];
await openai.responses.create({ model: 'gpt-4.1-mini', instructions: 'You are a helpful assistant.', tools: rtools, input: turn2, max_output_tokens: 256, store: false }, h('responses-turn2'));
const turn3 = [...turn2,
  { type: 'message', id: 'msg_1', role: 'assistant', status: 'completed', content: [{ type: 'output_text', text: 'A red pixel. Paris: 18 °C and clear.', annotations: [] }] },
  { role: 'user', content: 'And in Lyon?' },
];
await openai.responses.create({ model: 'gpt-4.1-mini', instructions: 'You are a helpful assistant.', tools: rtools, input: turn3, max_output_tokens: 256, store: false }, h('responses-turn3'));
await openai.responses.create({ model: 'gpt-4.1-mini', previous_response_id: 'resp_123', input: 'And in Lyon?', prompt_cache_key: 'conv-7' }, h('responses-previous'));
const s = await openai.responses.create({ model: 'gpt-4.1-mini', input: 'Say hi.', stream: true }, h('responses-string'));
try { for await (const _ of s) {} } catch {}

await openai.chat.completions.create({
  model: 'gpt-4.1-mini',
  messages: [
    { role: 'system', content: 'You are a helpful assistant.' },
    { role: 'user', content: [ { type: 'text', text: 'What is in this picture, and what is the weather in Paris?' }, { type: 'image_url', image_url: { url: `data:image/png;base64,${png2}`, detail: 'low' } } ] },
    { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
    { role: 'tool', tool_call_id: 'call_1', content: '{"temp_c":18,"sky":"clear"}' },
  ],
  tools: [{ type: 'function', function: weatherFn }],
  max_completion_tokens: 256,
}, h('chat-tools-image'));

await anthropic.messages.create({
  model: 'claude-sonnet-4-5',
  max_tokens: 1024,
  system: 'You are a helpful assistant.',
  tools: [{ name: 'get_weather', description: 'Get the current weather in a city', input_schema: weatherFn.parameters }],
  messages: [
    { role: 'user', content: [ { type: 'image', source: { type: 'base64', media_type: 'image/png', data: png1 } }, { type: 'text', text: 'What is in this picture, and what is the weather in Paris?' } ] },
    { role: 'assistant', content: [ { type: 'text', text: 'Let me check.' }, { type: 'tool_use', id: 'toolu_1', name: 'get_weather', input: { city: 'Paris' } } ] },
    { role: 'user', content: [ { type: 'tool_result', tool_use_id: 'toolu_1', content: '{"temp_c":18,"sky":"clear"}' } ] },
  ],
}, h('anthropic-tools-image'));
await anthropic.messages.create({ model: 'claude-sonnet-4-5', max_tokens: 64, messages: [{ role: 'user', content: 'Hi' }] }, h('anthropic-no-system'));
server.close();
