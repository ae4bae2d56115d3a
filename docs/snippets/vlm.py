import hf_hsap
from hf_hsap.examples import tiny_vlm, vlm_documents

model = tiny_vlm("qwen2_5_vl")            # a random tiny Qwen2.5-VL, attn_implementation="hsap"
sp = hf_hsap.init_sequence_parallel(1)    # under a launcher: P ranks
hf_hsap.prepare_model(model, sp_size=sp.size)  # counts decoder layers; makes the model keep its rank's image rows
docs = vlm_documents(model.config, [(3, (1, 4, 4), 5), (2, None, 4), (6, (1, 8, 4), 1)])  # processor-like:
                                          # text, an image of 1 x 4 x 4 patches, text; a text-only document; ...
collate = hf_hsap.PackingCollator(max_length=64, pad_to_multiple_of=sp.size, vision=hf_hsap.vision_spec(model))
batch = collate(docs)                     # one row: pixels in document order, position_ids [4, 1, 64]
local = hf_hsap.shard_batch(batch, sp)    # this rank's tokens, and the images they show
out = model(**local)
out.loss.backward()
print(f"loss {out.loss.item():.4f}; images on this rank: {local['image_grid_thw'].shape[0]}")
